//! gubernator's GLOBAL behaviour (github.com/gubernator-io/gubernator, `global.go` and
//! `gubernator.go`), modelled for comparison, with a fixed window aligned to the clock as the
//! rate limit (gubernator's token bucket is a window that starts at a key's first hit; aligned
//! windows make the runs comparable and change nothing below):
//!
//! - every node keeps one item per key, (window, remaining): the owner's is the key's
//!   authoritative count, the others' a copy. A node that does not own a key answers from its
//!   copy "as if it owned it" (`getGlobalRateLimit`), creating a full one when it has none for
//!   the window, and queues the hit for the owner whatever the answer;
//! - queued hits are summed per key and sent, one call per owner, `GlobalSyncWait` (100 ms)
//!   after the first hit queued since the last send, or at once when 1,000 keys are queued
//!   (`GlobalBatchLimit`, `runAsyncHits`);
//! - the owner applies them with `DRAIN_OVER_LIMIT` (hits beyond what remains empty it), and
//!   every change to a key it owns (its own requests too) queues the key for a broadcast,
//!   sent the same way (`runBroadcasts`): one call to every other peer carrying each queued
//!   key's current remaining, which the peers put in place of their copy (`UpdatePeerGlobals`);
//! - failure detection is this simulation's (the first failed call marks the peer down), not
//!   gubernator's (its peer list comes from discovery, usually slower); hits sent to a dead
//!   owner are lost, as in gubernator.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;

use super::{Call, Event, Payload, Sim, Task};

/// GlobalSyncWait (default 100 ms).
const SYNC_US: u64 = 100_000;
/// GlobalBatchLimit (default 1,000, gubernator's `maxBatchSize`).
const BATCH_LIMIT: usize = 1000;

/// gubernator's `Interval`: a one-shot timer that `next` arms, and that remembers one more
/// `next` made while it runs.
#[derive(Default)]
struct Interval {
    armed: bool,
    queued: bool,
}

impl Interval {
    /// Arms the timer at `now`: the time it fires, when it was not running.
    fn next(&mut self, now: u64) -> Option<u64> {
        if self.armed {
            self.queued = true;
            None
        } else {
            self.armed = true;
            Some(now + SYNC_US)
        }
    }

    /// The timer fired at `now`: when it fires again, if a `next` came meanwhile.
    fn fired(&mut self, now: u64) -> Option<u64> {
        self.armed = std::mem::take(&mut self.queued);
        self.armed.then_some(now + SYNC_US)
    }
}

#[derive(Default)]
struct GlobalNode {
    /// key -> (window, remaining).
    items: HashMap<u32, (u64, u32)>,
    hits: BTreeMap<u32, u32>,
    hits_timer: Interval,
    updates: BTreeSet<u32>,
    updates_timer: Interval,
}

pub(super) struct Globals {
    nodes: Vec<GlobalNode>,
}

impl Globals {
    pub(super) fn new(nodes: usize) -> Self {
        Globals {
            nodes: (0..nodes).map(|_| GlobalNode::default()).collect(),
        }
    }
}

impl Sim<'_> {
    fn globals(&mut self) -> &mut Globals {
        self.global.as_mut().expect("global mode")
    }

    /// `node`'s item for `key` in the window of `now`: a full one if it has none for it.
    fn item(&mut self, node: usize, key: usize, now: u64) -> &mut (u64, u32) {
        let window = self.window_of(now);
        let limit = self.w.limits[key];
        let item = self.globals().nodes[node]
            .items
            .entry(key as u32)
            .or_insert((window, limit));
        if item.0 != window {
            *item = (window, limit);
        }
        item
    }

    /// A request for `key` arrives at `node` at `now`: answered from `node`'s item, owner or not.
    pub(super) fn global_route(&mut self, node: usize, key: usize, now: u64) {
        let owner = self.owner(node, key);
        let item = self.item(node, key, now);
        let admitted = item.1 >= 1;
        item.1 -= u32::from(admitted);
        self.record(key, now, admitted, 0);
        if owner == node {
            self.queue_update(node, key, now);
        } else {
            self.queue_hit(node, key, now);
        }
    }

    fn queue_hit(&mut self, node: usize, key: usize, now: u64) {
        let g = &mut self.globals().nodes[node];
        *g.hits.entry(key as u32).or_default() += 1;
        if g.hits.len() == BATCH_LIMIT {
            self.send_hits(node, now);
        } else if g.hits.len() == 1
            && let Some(at) = g.hits_timer.next(now)
        {
            self.schedule(node, Task::SendHits, at);
        }
    }

    fn queue_update(&mut self, node: usize, key: usize, now: u64) {
        let g = &mut self.globals().nodes[node];
        g.updates.insert(key as u32);
        if g.updates.len() >= BATCH_LIMIT {
            self.broadcast(node, now);
        } else if g.updates.len() == 1
            && let Some(at) = g.updates_timer.next(now)
        {
            self.schedule(node, Task::Broadcast, at);
        }
    }

    fn schedule(&mut self, node: usize, task: Task, at: u64) {
        let life = self.life[node];
        self.push(
            at,
            Event::Tick {
                node: node as u16,
                life,
                task,
            },
        );
    }

    pub(super) fn global_send_tick(&mut self, node: usize, now: u64) {
        if let Some(at) = self.globals().nodes[node].hits_timer.fired(now) {
            self.schedule(node, Task::SendHits, at);
        }
        if !self.globals().nodes[node].hits.is_empty() {
            self.send_hits(node, now);
        }
    }

    pub(super) fn global_broadcast_tick(&mut self, node: usize, now: u64) {
        if let Some(at) = self.globals().nodes[node].updates_timer.fired(now) {
            self.schedule(node, Task::Broadcast, at);
        }
        if !self.globals().nodes[node].updates.is_empty() {
            self.broadcast(node, now);
        }
    }

    /// Sends `node`'s queued hits, one call per owner (`sendHits`).
    fn send_hits(&mut self, node: usize, now: u64) {
        let hits = std::mem::take(&mut self.globals().nodes[node].hits);
        let mut by_owner: BTreeMap<usize, Vec<(u32, u32)>> = BTreeMap::new();
        for (key, n) in hits {
            let owner = self.owner(node, key as usize);
            by_owner.entry(owner).or_default().push((key, n));
        }
        for (owner, hits) in by_owner {
            if owner == node {
                self.apply_hits(node, &hits, now);
                continue;
            }
            let call = Call {
                from: node as u16,
                to: owner as u16,
                life: self.life[node],
                sent: now,
                payload: Payload::Hits(hits),
            };
            self.out.background_calls += 1;
            self.send_call(call, now);
        }
    }

    /// The owner applies hits sent to it, draining what is left when they exceed it.
    fn apply_hits(&mut self, owner: usize, hits: &[(u32, u32)], now: u64) {
        for &(key, n) in hits {
            let item = self.item(owner, key as usize, now);
            item.1 = item.1.saturating_sub(n);
            self.queue_update(owner, key as usize, now);
        }
    }

    /// `node` broadcasts the current remaining of every key queued to every other peer it
    /// believes up (`broadcastPeers`).
    fn broadcast(&mut self, node: usize, now: u64) {
        let keys = std::mem::take(&mut self.globals().nodes[node].updates);
        let globals: Rc<[(u32, u64, u32)]> = keys
            .into_iter()
            .map(|key| {
                let item = *self.item(node, key as usize, now);
                (key, item.0, item.1)
            })
            .collect();
        for peer in 0..self.alive.len() {
            if peer == node || !self.view[node][peer] {
                continue;
            }
            let call = Call {
                from: node as u16,
                to: peer as u16,
                life: self.life[node],
                sent: now,
                payload: Payload::Globals(globals.clone()),
            };
            self.out.background_calls += 1;
            self.send_call(call, now);
        }
    }

    /// A global call reaches `to`, running.
    pub(super) fn global_receive(&mut self, to: usize, payload: Payload, now: u64) {
        match payload {
            Payload::Hits(hits) => self.apply_hits(to, &hits, now),
            Payload::Globals(globals) => {
                let items = &mut self.globals().nodes[to].items;
                for &(key, window, remaining) in globals.iter() {
                    items.insert(key, (window, remaining));
                }
            }
            Payload::Lease(_) => {}
        }
    }

    /// `node` died or starts afresh: its items and queues are gone.
    pub(super) fn global_lost(&mut self, node: usize) {
        if let Some(g) = self.global.as_mut() {
            g.nodes[node] = GlobalNode::default();
        }
    }
}
