//! Lease mode (SLUICE_CLUSTER_MODE=lease): global limits decided with no network hop on the
//! request path. Each key's owner on the ring is its lease server ([`server`]): it hands every
//! node that asks a lease on part of the key's capacity, sized by max-min fair share
//! ([`crate::limiter::share`]) on the nodes' attempted demand, and the nodes decide locally from what they hold
//! ([`client`]).
//!
//! - **Cold keys**: a node that holds nothing for a key sends the hit's owner an *acquire* with
//!   its first hit (one hop), and decides locally from then on. A hit that does not fit what
//!   the node holds may acquire again: for a window at once, backing off once acquires bring
//!   nothing; for a bucket at most once per renewal interval.
//! - **Renewals**: every SLUICE_LEASE_RENEW_MS one task sends each owner one call carrying
//!   every key this node holds of it, with what it used, what it keeps and its demand. Peer
//!   traffic grows with peers and renewal ticks, not with requests.
//! - **Boundaries**: a fixed window's next allowance is granted ahead in the last renewal
//!   horizon of the window, so a new window needs no call.
//! - **Failure**: a node keeps deciding from its leases when their owner is unreachable (a
//!   partitioned node never passes its last lease); a new owner rebuilds each key from the
//!   nodes' reports, capping grants at an equal share until a lease duration has passed.
//! - **Bounds**: SLUICE_LEASE_MAX_BYTES for the leases a node holds and for those it grants as
//!   an owner, each entry charged its key (or holder name) and its measured overhead; past it,
//!   a key's hits are forwarded to its owner as in forward mode.
//! - **Wire**: asks and grants travel in the peer protocol's Lease call (`wire.rs` converts
//!   them, at most [`MAX_LEASE_ASKS`] a call).
//!
//! [`server`], [`client`], [`free`] and [`parent`] are the logic, with no I/O; [`parent_link`]
//! makes a lease cluster's calls to its parent cluster (SLUICE_LEASE_PARENT). Lease mode on a
//! node, its routing and the calls and tasks that run this logic (acquires, renewals, the
//! sweep), is `cluster::route::leased`: it answers through this node's owner store, which the
//! logic stands below.

pub(crate) mod client;
mod deadlines;
pub mod free;
pub mod parent;
pub(crate) mod parent_link;
pub(crate) mod server;
mod window;
mod wire;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use dashmap::DashMap;
use tokio::sync::Notify;

use crate::limiter::{Algorithm, Decision, Quota};
use client::{Held, Local};
use deadlines::Deadlines;
use free::{FreeRoute, FreeShares, Terms};
pub use server::{Ask, Grant, LeaseServer, LeaseTiming};
pub(crate) use server::{Capacity, HolderView};
pub use wire::MAX_LEASE_ASKS;

/// One key this node holds: its lease, and a wake-up for the hits waiting on a call about it.
pub struct Slot {
    /// The key, shared with the table's entry: a renewal names it with no copy.
    key: Arc<str>,
    held: Mutex<Held>,
    pub(crate) answered: Notify,
}

impl Slot {
    /// Whether a call about the key is under way.
    pub fn in_flight(&self) -> bool {
        self.lock().in_flight
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies the answer to an ask sent at `sent_us` (`None`: the call failed) and wakes the
    /// hits waiting for it.
    pub fn answer(&self, grant: Option<&Grant>, sent_us: u64) {
        {
            let mut held = self.lock();
            match grant {
                Some(g) => held.grant(g, sent_us),
                None => held.failed(),
            }
        }
        self.answered.notify_waiters();
    }

    /// Decides hits that waited for a call, without acquiring again.
    pub fn decide_after(&self, now_us: u64, hits: u64) -> Decision {
        self.lock().decide_after_acquire(now_us, hits)
    }
}

/// What this node does with one hit in lease mode.
pub enum Route {
    /// Decided locally.
    Decided(Decision),
    /// Send this acquire to the key's owner, then [`Slot::answer`] and [`Slot::decide_after`].
    Acquire(Arc<Slot>, Ask),
    /// Wait for the call under way about the key (`Slot::answered`), then [`Slot::decide_after`].
    Wait(Arc<Slot>),
    /// Not leased here (the table is full): forward the hit to its owner.
    Forward,
}

/// A renewal due: the key, the slot its answer goes to, and the ask.
pub type Due = (Arc<str>, Arc<Slot>, Ask);

/// What lease mode did, for `/stats` and `/metrics`.
#[derive(Debug, Default)]
pub struct LeaseStats {
    /// Hits decided from a lease, with no call.
    pub local_decisions: AtomicU64,
    /// Acquires sent (hits that did not fit what this node held).
    pub acquires: AtomicU64,
    /// Keys renewed, and the calls that carried them.
    pub renewals: AtomicU64,
    pub renewal_calls: AtomicU64,
    /// Keys this node stopped holding: no hit and nothing held for a lease duration.
    pub expired: AtomicU64,
    /// Hits forwarded because a lease table was full.
    pub forwarded: AtomicU64,
}

impl LeaseClient {
    /// [`LeaseStats::snapshot`], with the free shares' counters (0 when they are off).
    pub(crate) fn stats_snapshot(&self) -> Vec<(&'static str, u64)> {
        let mut out = self.stats.snapshot();
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let (decisions, conversions) = self
            .free
            .as_ref()
            .map_or((0, 0), |f| (load(&f.decisions), load(&f.conversions)));
        out.push(("free_decisions", decisions));
        out.push(("free_conversions", conversions));
        out
    }
}

impl LeaseStats {
    /// (name, value) of each counter, for `/stats` and `/metrics`.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("local_decisions", load(&self.local_decisions)),
            ("acquires", load(&self.acquires)),
            ("renewals", load(&self.renewals)),
            ("renewal_calls", load(&self.renewal_calls)),
            ("expired", load(&self.expired)),
            ("forwarded", load(&self.forwarded)),
        ]
    }
}

/// One key's leases as this node sees them, for the debug endpoint (`/debug/lease?key=`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub(crate) struct KeyView {
    pub key: String,
    /// This node's address among the peers, and the key's owner as it sees the ring now.
    pub node: String,
    pub owner: String,
    /// What this node holds: the window index (0 for a bucket), the allowance (a bucket: the
    /// share in parts per million) and the hits used in the window.
    pub held: Option<HeldView>,
    /// When this node leases the key: every holder's lease.
    pub holders: Vec<HolderView>,
    /// Below a parent (SLUICE_LEASE_PARENT), when this node owns the key: what the parent
    /// granted this cluster.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<parent::ParentView>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct HeldView {
    pub epoch: u64,
    pub allowance: u64,
    pub used: u64,
}

/// The keys this node holds leases on.
///
/// A renewal round looks only at the keys something happened to since they were last found
/// quiet (`queue`: a hit, a refund, an acquire, what they hold beyond their use), and at every
/// key once after a ring change; a quiet key is parked until it may be forgotten (`quiet`: the
/// end of its window, a lease duration after its last hit). So a key nobody uses costs nothing
/// between its last renewal and its window's end, however many are held.
pub struct LeaseClient {
    slots: DashMap<Arc<str>, Arc<Slot>, foldhash::fast::RandomState>,
    /// The slots the next renewal round looks at (each with [`Held::queued`] set).
    queue: Mutex<Vec<Arc<Slot>>>,
    /// Quiet slots, until they may be forgotten ([`Held::forget_at`]).
    quiet: Deadlines<Arc<Slot>>,
    /// The ring changes the last round had seen: a new one queues every key (a new owner must
    /// learn what is held).
    changes_seen: AtomicU64,
    /// The keys decided from free shares (`None`: off, SLUICE_LEASE_FREE_SHARE_PERCENT=0).
    free: Option<FreeShares>,
    timing: LeaseTiming,
    /// Bytes charged for the slots ([`SLOT_CHARGE`] plus the key's length each), held to
    /// `timing.max_bytes`.
    bytes: AtomicUsize,
    pub stats: LeaseStats,
}

/// What a held key costs beside its key's bytes: `bench/programs/src/bin/lease_memory.rs` measures
/// at most 457 with the key (27 to 31 bytes, 40,000 to 300,000 keys; 357 before the renewal rounds'
/// queue and parking, issue 49), rounded up here; the program fails when a measurement passes the
/// charge.
pub const SLOT_CHARGE: usize = 448;

impl LeaseClient {
    pub fn new(timing: LeaseTiming) -> Self {
        LeaseClient {
            slots: DashMap::default(),
            queue: Mutex::new(Vec::new()),
            quiet: Deadlines::new(window::micros(timing.renew)),
            changes_seen: AtomicU64::new(0),
            free: None,
            timing,
            bytes: AtomicUsize::new(0),
            stats: LeaseStats::default(),
        }
    }

    /// A client that decides keys far below their limit from free shares ([`free`]), for a
    /// node started at `started_us`, when `timing` gives them a share.
    pub fn with_free_shares(timing: LeaseTiming, started_us: u64) -> Self {
        let free = (timing.free_share_ppm > 0).then(|| {
            let tick = window::micros(timing.renew);
            FreeShares::new(started_us, timing.duration_us(), tick, timing.max_bytes)
        });
        LeaseClient {
            free,
            ..Self::new(timing)
        }
    }

    /// The free shares' table, when they are on.
    pub fn free(&self) -> Option<&FreeShares> {
        self.free.as_ref()
    }

    pub fn timing(&self) -> &LeaseTiming {
        &self.timing
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// How `hits` on `key` are decided at `now_us`; `live` counts the live peers and `terms`
    /// is the permit of the key's owner for free shares (both asked only for a key not held
    /// here).
    pub fn route(
        &self,
        key: &str,
        quota: Quota,
        now_us: u64,
        hits: u64,
        live: impl FnOnce() -> usize,
        terms: impl FnOnce() -> Option<Terms>,
    ) -> Route {
        // A lease cannot hold a debt its holder refused into, nor slots that one node's end
        // of a request must give back on another: such limits (`charge_refused`, concurrency)
        // are counted by their owner, exactly (not in `forwarded`, which says a table is full).
        // So are limits with a penalty (`penalty_seconds`): the owner keeps it, and a lease
        // would admit its share while the owner refuses the key.
        if quota.charge_refused
            || quota.algorithm == Algorithm::Concurrency
            || quota.penalty.is_some()
        {
            return Route::Forward;
        }
        let renew = window::micros(self.timing.renew);
        // The hot path: a key held under the same quota, decided under the map's read guard
        // with no reference count taken.
        let mut freely = 0;
        match self.slots.get(key) {
            Some(slot) => {
                let mut held = slot.lock();
                if *held.quota() == quota {
                    let local = held.decide(now_us, hits, renew);
                    self.wake(&slot, &mut held);
                    drop(held);
                    return self.outcome(local, || slot.clone());
                }
            }
            // Not held: a key far below its limit is decided from the free share, with no
            // call; past it, the lease it takes starts from what was admitted freely.
            None => {
                if let Some(free) = self.free.as_ref().filter(|_| free::eligible(&quota)) {
                    match free.admit(key, &quota, now_us, hits, terms()) {
                        FreeRoute::Admitted(d) => return Route::Decided(d),
                        FreeRoute::Lease { used } => freely = used,
                    }
                }
            }
        }
        let Some(slot) = self.slot_for(key, quota, now_us, live(), freely) else {
            self.stats.forwarded.fetch_add(1, Ordering::Relaxed);
            return Route::Forward;
        };
        let mut held = slot.lock();
        let local = held.decide(now_us, hits, renew);
        self.wake(&slot, &mut held);
        drop(held);
        self.outcome(local, || slot)
    }

    /// Puts `slot` (whose `held` was just changed) in the next renewal round's queue, unless it
    /// is there already: the only cost a hit on a held key adds.
    fn wake(&self, slot: &Arc<Slot>, held: &mut Held) {
        if !held.queued {
            held.queued = true;
            self.queue
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(slot.clone());
        }
    }

    fn outcome(&self, local: Local, slot: impl FnOnce() -> Arc<Slot>) -> Route {
        match local {
            Local::Decided(d) => {
                self.stats.local_decisions.fetch_add(1, Ordering::Relaxed);
                Route::Decided(d)
            }
            Local::Acquire(ask) => {
                self.stats.acquires.fetch_add(1, Ordering::Relaxed);
                Route::Acquire(slot(), ask)
            }
            Local::Wait => Route::Wait(slot()),
        }
    }

    /// A new slot for `key` (or, when its quota changed, the slot it has under the new limit,
    /// or a fresh one for another counter), holding the `freely` hits this node admitted from
    /// its free share in the window; `None` when the table is full.
    fn slot_for(
        &self,
        key: &str,
        quota: Quota,
        now_us: u64,
        live: usize,
        freely: u64,
    ) -> Option<Arc<Slot>> {
        if !self.slots.contains_key(key)
            && self.bytes.load(Ordering::Relaxed) >= self.timing.max_bytes
        {
            return None;
        }
        let live = u64::try_from(live).unwrap_or(u64::MAX);
        let key: Arc<str> = key.into();
        let fresh = || {
            Arc::new(Slot {
                key: key.clone(),
                held: Mutex::new(Held::new(quota, now_us, live)),
                answered: Notify::new(),
            })
        };
        let mut entry = self.slots.entry(key.clone()).or_insert_with(|| {
            self.bytes
                .fetch_add(SLOT_CHARGE + key.len(), Ordering::Relaxed);
            fresh()
        });
        let kept = {
            let mut held = entry.lock();
            *held.quota() == quota || held.requota(quota, now_us)
        };
        if !kept {
            // Another counter: a call under way answers the old slot, not this one.
            std::mem::replace(&mut *entry, fresh()).lock().gone = true;
        }
        if freely > 0 {
            let mut held = entry.lock();
            held.took_freely(now_us, freely);
            self.wake(&entry, &mut held);
        }
        Some(entry.clone())
    }

    /// Converts every key this node admitted freely in its current window into a lease holding
    /// what it admitted, reported to the key's owner at the next round: the ring changed, or an
    /// owner began a new run of permits ([`free`]). `live` sizes the leases' first demand.
    pub fn convert_free(&self, now_us: u64, live: usize) {
        if let Some(free) = &self.free {
            free.convert_all(now_us, |key, quota, used| {
                // A full table forwards the key's hits instead; the owner still charges the
                // free share until the window ends.
                let _ = self.slot_for(key, quota, now_us, live, used);
            });
        }
    }

    /// `key`'s owner recalled its free share (under `quota`) at `now_us` until `until_us`
    /// ([`free`]): the key is decided from a lease from now on, which reports what was
    /// admitted freely at the next renewal round, and in every window that begins before
    /// `until_us`. Ignored when the tables have no room for it (the owner goes on charging this
    /// node its free share). `live` sizes a new lease's first demand.
    pub fn recall(&self, key: &str, quota: Quota, until_us: u64, now_us: u64, live: usize) {
        let Some(free) = self.free.as_ref().filter(|_| free::eligible(&quota)) else {
            return;
        };
        let Some(used) = free.recall(key, &quota, now_us) else {
            return;
        };
        // A key held already keeps its slot, under the quota its own hits name.
        let held = self.slots.get(key).map(|s| s.clone());
        let Some(slot) = held.or_else(|| self.slot_for(key, quota, now_us, live, 0)) else {
            return;
        };
        let mut held = slot.lock();
        held.took_freely(now_us, used);
        if held.recall(now_us, until_us) {
            self.wake(&slot, &mut held);
        }
    }

    /// [`client::Held::admit_held`] on `key` held under `quota` (or its counter under another
    /// limit, which it takes): `None` when not held here.
    pub(crate) fn admit_held(
        &self,
        key: &str,
        quota: Quota,
        now_us: u64,
        hits: u64,
    ) -> Option<Result<Decision, u64>> {
        let slot = self.slots.get(key)?;
        let mut held = slot.lock();
        let kept = *held.quota() == quota || held.requota(quota, now_us);
        let decided = kept.then(|| held.admit_held(now_us, hits));
        self.wake(&slot, &mut held);
        decided
    }

    /// [`client::Held::admitted_alone`] on `key`, when it is held here.
    pub(crate) fn admitted_alone(&self, key: &str, now_us: u64, hits: u64) {
        if let Some(slot) = self.slots.get(key) {
            let mut held = slot.lock();
            held.admitted_alone(now_us, hits);
            self.wake(&slot, &mut held);
        }
    }

    /// Takes `hits` off what this node used of `key` (a refund), and answers a peek at what is
    /// left; `None` when the key is not held here (its hits were forwarded, so the refund must
    /// be too).
    pub fn refund(&self, key: &str, now_us: u64, hits: u64) -> Option<Decision> {
        self.slots.get(key).map(|slot| {
            let mut held = slot.lock();
            let left = held.refund(now_us, hits);
            self.wake(&slot, &mut held);
            left
        })
    }

    /// The owner refused to lease `key`: forget it, so its hits are forwarded.
    pub(crate) fn unleased(&self, key: &str) {
        if let Some((_, slot)) = self.slots.remove(key) {
            slot.lock().gone = true;
            self.uncharge(key);
        }
    }

    fn uncharge(&self, key: &str) {
        self.bytes
            .fetch_sub(SLOT_CHARGE + key.len(), Ordering::Relaxed);
    }

    /// Bytes charged for the slots, for `/metrics`.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// The renewals due at `now_us`, with the slot each answer goes to, and forgets the keys
    /// that are idle. `changes` counts the ring changes seen so far. Looks only at the queued
    /// keys (every key after a ring change) and the quiet ones whose time to be forgotten came.
    pub fn renewals(&self, now_us: u64, changes: u64, live: usize) -> Vec<Due> {
        if self.changes_seen.swap(changes, Ordering::Relaxed) != changes {
            self.convert_free(now_us, live);
            self.queue_all();
        }
        if let Some(free) = &self.free {
            free.forget_ended(now_us);
        }
        let queued =
            std::mem::take(&mut *self.queue.lock().unwrap_or_else(PoisonError::into_inner));
        let mut due = Vec::new();
        let mut again = Vec::new();
        for slot in queued {
            let mut held = slot.lock();
            if held.gone {
                continue;
            }
            if let Some(ask) = held.renewal(now_us, changes, &self.timing) {
                due.push((slot.key.clone(), slot.clone(), ask));
            } else if !held.in_flight {
                // Quiet: out of the rounds until a hit, or its time to be forgotten.
                held.queued = false;
                let at = self
                    .quiet
                    .rounded(held.forget_at(&self.timing).max(now_us + 1));
                held.parked_us = at;
                drop(held);
                self.quiet.park(at, slot);
                continue;
            }
            drop(held);
            again.push(slot);
        }
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(again);
        self.forget_quiet(now_us);
        self.stats
            .renewals
            .fetch_add(due.len() as u64, Ordering::Relaxed);
        due
    }

    /// Queues every slot not queued yet.
    fn queue_all(&self) {
        for entry in &self.slots {
            self.wake(entry.value(), &mut entry.value().lock());
        }
    }

    /// Forgets the parked slots that are idle at `now_us`, and parks again those whose time
    /// moved on (a slot queued since, or parked again, is not this parking's).
    fn forget_quiet(&self, now_us: u64) {
        for slot in self.quiet.due(now_us) {
            let mut held = slot.lock();
            if held.gone || held.queued || held.parked_us > now_us {
                continue;
            }
            if held.recall_due(now_us) {
                self.wake(&slot, &mut held);
                continue;
            }
            if !held.idle(now_us, &self.timing) {
                let at = self
                    .quiet
                    .rounded(held.forget_at(&self.timing).max(now_us + 1));
                held.parked_us = at;
                drop(held);
                self.quiet.park(at, slot);
                continue;
            }
            drop(held);
            let gone = self.slots.remove_if(&*slot.key, |_, s| {
                let mut held = s.lock();
                let idle = Arc::ptr_eq(s, &slot) && !held.queued && held.idle(now_us, &self.timing);
                held.gone |= idle;
                idle
            });
            if gone.is_some() {
                self.uncharge(&slot.key);
                self.stats.expired.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// What this node holds of `key`.
    pub fn holding(&self, key: &str) -> Option<HeldView> {
        self.slots.get(key).map(|s| {
            let (epoch, allowance, used) = s.lock().holding();
            HeldView {
                epoch,
                allowance,
                used,
            }
        })
    }
}

#[cfg(test)]
mod tests;
