//! Lease mode's calls on one node ([`Leasing`]): the acquires the routing sends ([`super`]),
//! and the two background tasks: renewals (one call per owner per SLUICE_LEASE_RENEW_MS,
//! carrying every key held of it) and the lease server's sweep. The lease logic itself is
//! `cluster::lease` (`server`, `client`), with no I/O; this and the parent link
//! (`cluster::lease::parent_link`) are the only lease code that does any.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::clock::Clock;
use crate::cluster::ClusterConfig;
use crate::cluster::durable::RingChanges;
use crate::cluster::lease::free::{Permit, Recall, Terms};
use crate::cluster::lease::{
    Ask, Due, Grant, KeyView, LeaseClient, LeaseTiming, MAX_LEASE_ASKS, Slot,
};
use crate::cluster::members::Members;
use crate::cluster::owner::OwnerStore;
use crate::cluster::peer::{Call, FreeRecall, LeaseAsk, PeerError};
use crate::limiter::Decision;
use crate::store::{Cause, Hit, StoreError};

/// Lease mode's state on one node: the leases it holds and what it needs to ask for more.
pub(crate) struct Leasing {
    pub client: LeaseClient,
    owner: Arc<OwnerStore>,
    members: Arc<ArcSwap<Members>>,
    changes: Arc<RingChanges>,
    pub(in crate::cluster) clock: Arc<dyn Clock>,
    /// This node's PEER_ADVERTISE_ADDRESS, which names its leases at the owners.
    advertise: String,
    /// How long a request waits for another's call about its key: that call's deadline
    /// (SLUICE_PEER_TIMEOUT_MS, plus below a parent the owner's wait for it), and a timeout
    /// more.
    wait: Duration,
    /// Each owner's permit for free shares (by its address), as this node last got it.
    permits: RwLock<HashMap<String, Terms>>,
}

/// An acquire waiting for its owner's answer: the hit's index, its slot and its ask.
type Pending = (usize, Arc<Slot>, Ask);

impl Leasing {
    pub(in crate::cluster) fn new(
        settings: &ClusterConfig,
        owner: Arc<OwnerStore>,
        members: Arc<ArcSwap<Members>>,
        changes: Arc<RingChanges>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let started_us = clock.now().micros();
        Leasing {
            client: LeaseClient::with_free_shares(settings.lease, started_us),
            owner,
            members,
            changes,
            clock,
            advertise: settings.advertise.clone(),
            wait: settings.timeout * 2 + settings.parent_wait(),
            permits: RwLock::new(HashMap::new()),
        }
    }

    /// The permit of `key`'s owner for free shares, if it holds one.
    pub(in crate::cluster) fn terms(&self, members: &Members, key: &str) -> Option<Terms> {
        let owner = members.ring().addr(members.owner(key));
        self.permits
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(owner)
            .copied()
    }

    /// Keeps the permit `owner` answered to a call sent at `sent_us` (`None`: it gave none, so
    /// a share of 0, asked again in half a lease duration), and takes its `recalls`. A new run
    /// of permits from it (it restarted, or this node's lapsed) converts every key this node
    /// admitted freely: the owner may not know what it admitted.
    fn took_permit(
        &self,
        members: &Members,
        owner: usize,
        sent_us: u64,
        permit: Option<Permit>,
        recalls: Vec<Recall>,
    ) {
        if self.client.free().is_none() {
            return;
        }
        let now_us = self.clock.now().micros();
        for r in recalls {
            let live = members.live();
            self.client
                .recall(&r.key, r.quota, r.until_us, now_us, live);
        }
        let addr = members.ring().addr(owner);
        let p = permit.unwrap_or(Permit {
            since_us: 0,
            valid_us: self.timing().duration_us(),
            share_ppm: 0,
        });
        let mut permits = self.permits.write().unwrap_or_else(PoisonError::into_inner);
        let terms = Terms {
            since_us: p.since_us,
            until_us: sent_us.saturating_add(p.valid_us),
            share_ppm: p.share_ppm,
        };
        let before = permits.insert(addr.to_owned(), terms);
        drop(permits);
        if before.is_some_and(|b| b.share_ppm > 0 && b.since_us != p.since_us) {
            self.client.convert_free(sent_us, members.live());
        }
    }

    fn timing(&self) -> &LeaseTiming {
        self.client.timing()
    }

    /// The renewal task and the lease server's sweep.
    pub(crate) fn spawn(self: &Arc<Self>) -> Vec<tokio::task::JoinHandle<()>> {
        let renewing = self.clone();
        let sweeping = self.clone();
        vec![
            tokio::spawn(async move { renewing.renew_forever().await }),
            tokio::spawn(async move { sweeping.sweep_forever().await }),
        ]
    }

    /// Sends `asks` (keys and asks) to `owner` (this node's own lease server, or a call), and
    /// marks a peer whose call fails down.
    async fn send(
        &self,
        members: &Members,
        owner: usize,
        asks: &[(&str, Ask)],
    ) -> Result<Vec<Grant>, PeerError> {
        let sent = self.clock.now();
        let free = self.client.free().is_some();
        if owner == members.me {
            // The refusal this node's owner side gives a peer's call when not in lease mode.
            let grants = self
                .owner
                .answer_leases(&self.advertise, asks, sent)
                .await
                .ok_or_else(|| PeerError::Refused {
                    call: Call::Lease,
                    code: tonic::Code::FailedPrecondition,
                    message: "this node is not in lease mode".to_owned(),
                })?;
            let permit = free
                .then(|| self.owner.permit(&self.advertise, sent))
                .flatten();
            let recalls = match permit {
                Some(_) => self.owner.recalls(&self.advertise),
                None => Vec::new(),
            };
            self.took_permit(members, owner, sent.micros(), permit, recalls);
            return Ok(grants);
        }
        let Some(client) = members.client(owner) else {
            return Err(PeerError::NoClient("no client for the peer"));
        };
        let wire = asks.iter().map(|(k, a)| LeaseAsk::from_ask(k, a)).collect();
        match client.lease_with_permit(&self.advertise, wire, free).await {
            Ok(mut answer) => {
                let permit = answer.permit.map(|p| Permit {
                    since_us: p.since_us,
                    valid_us: p.valid_us,
                    share_ppm: p.share_ppm,
                });
                let recalls = answer
                    .recalls
                    .iter_mut()
                    .filter_map(FreeRecall::take_recall)
                    .collect();
                self.took_permit(members, owner, sent.micros(), permit, recalls);
                Ok(answer.grants.iter().map(Grant::from).collect())
            }
            Err(e) => {
                members.failed(owner, &e, &self.changes, self.clock.now());
                Err(e)
            }
        }
    }

    async fn renew_forever(&self) {
        let mut tick = tokio::time::interval(self.timing().renew);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.renew_once().await;
        }
    }

    /// One renewal round: every key due, one call per owner (in chunks of
    /// [`MAX_LEASE_ASKS`]), all owners at once.
    pub(crate) async fn renew_once(&self) {
        let members = self.members.load_full();
        // Cut off from a majority, a node renews nothing: the owners it reaches may be stand-ins
        // for the ones it cannot, and it decides from what it holds (super::minority).
        if !members.has_quorum() {
            return;
        }
        let now = self.clock.now();
        let (changes, _) = self.changes.last();
        let due = self.client.renewals(now.micros(), changes, members.live());
        let mut by_owner: HashMap<usize, Vec<Due>> = HashMap::new();
        for item in due {
            by_owner
                .entry(members.owner(&item.0))
                .or_default()
                .push(item);
        }
        let refresh = self.permits_to_renew(&members, now.micros(), &by_owner);
        let calls = by_owner.values().flat_map(|items| {
            let owner = members.owner(&items[0].0);
            items
                .chunks(MAX_LEASE_ASKS)
                .map(move |chunk| (owner, chunk))
        });
        let sent_us = now.micros();
        let calls = calls.map(|(owner, chunk)| {
            let members = &members;
            async move {
                let asks: Vec<(&str, Ask)> = chunk.iter().map(|(k, _, a)| (&**k, *a)).collect();
                self.client
                    .stats
                    .renewal_calls
                    .fetch_add(1, Ordering::Relaxed);
                let result = self.send(members, owner, &asks).await;
                for (i, (_, slot, _)) in chunk.iter().enumerate() {
                    slot.answer(result.as_ref().ok().map(|g| &g[i]), sent_us);
                }
            }
        });
        let refresh = refresh.into_iter().map(|owner| {
            let members = &members;
            async move {
                // A failed call marks the owner down, as any other.
                let _ = self.send(members, owner, &[]).await;
            }
        });
        futures_util::future::join(
            futures_util::future::join_all(calls),
            futures_util::future::join_all(refresh),
        )
        .await;
    }

    /// The owners this round must call only to get or renew this node's permit for free
    /// shares: those up that it has none of, or whose permit ends within half a lease duration,
    /// and that no renewal goes to this round (every Lease call renews the permit). One empty
    /// call per owner per half lease duration at most, whatever the number of keys.
    fn permits_to_renew(
        &self,
        members: &Members,
        now_us: u64,
        calls: &HashMap<usize, Vec<Due>>,
    ) -> Vec<usize> {
        if self.client.free().is_none() {
            return Vec::new();
        }
        let half = self.timing().duration_us() / 2;
        let permits = self.permits.read().unwrap_or_else(PoisonError::into_inner);
        (0..members.ring().len())
            .filter(|&i| members.up(i))
            .filter(|i| !calls.contains_key(i))
            .filter(|&i| {
                permits
                    .get(members.ring().addr(i))
                    .is_none_or(|t| t.until_us.saturating_sub(now_us) < half)
            })
            .collect()
    }

    async fn sweep_forever(&self) {
        let Some(server) = self.owner.leases() else {
            return;
        };
        let mut tick = tokio::time::interval(self.timing().duration);
        loop {
            tick.tick().await;
            server.sweep(self.clock.now());
        }
    }

    /// Sends the acquires in `pending` to their owners, twice at most (the second time to
    /// the next owners of those whose owner failed). Each answered hit gets its decision in
    /// `decisions`; a hit whose owner does not lease its key goes to `forward`. A hit whose
    /// owners both failed is decided from what is held if it fits, else is an error.
    pub(in crate::cluster) async fn acquire(
        &self,
        members: &Members,
        hits: &[Hit<'_>],
        mut pending: Vec<Pending>,
        decisions: &mut [Option<Decision>],
        forward: &mut Vec<usize>,
    ) -> Result<(), StoreError> {
        for round in 0..2 {
            if pending.is_empty() {
                break;
            }
            let mut groups: HashMap<usize, Vec<Pending>> = HashMap::new();
            for p in pending.drain(..) {
                groups
                    .entry(members.owner(hits[p.0].key))
                    .or_default()
                    .push(p);
            }
            let sent_us = self.clock.now().micros();
            let calls = groups.into_iter().map(|(owner, group)| async move {
                let asks: Vec<(&str, Ask)> =
                    group.iter().map(|(i, _, a)| (hits[*i].key, *a)).collect();
                let result = self.send(members, owner, &asks).await;
                (group, result)
            });
            let mut failed = None;
            for (group, result) in futures_util::future::join_all(calls).await {
                let grants = match result {
                    Ok(grants) => grants,
                    Err(e) => {
                        pending.extend(group);
                        failed = Some(e);
                        continue;
                    }
                };
                for ((i, slot, _), grant) in group.into_iter().zip(grants) {
                    if !grant.leased {
                        self.client.unleased(hits[i].key);
                        slot.answer(None, sent_us);
                        forward.push(i);
                        continue;
                    }
                    slot.answer(Some(&grant), sent_us);
                    decisions[i] = Some(slot.decide_after(sent_us, hits[i].hits));
                }
            }
            // Pending again means an owner failed this round: the last round fails the hits.
            if let (1, Some(e)) = (round, failed) {
                for (_, slot, _) in &pending {
                    slot.answer(None, sent_us);
                }
                return Err(StoreError::Peer {
                    message: "the owners of some counters did not answer a lease",
                    source: Cause::new(e),
                });
            }
        }
        Ok(())
    }

    /// Waits (up to the call's deadline and a peer timeout) for the call under way about
    /// `slot`'s key.
    pub(in crate::cluster) async fn wait_for(&self, slot: &Slot) {
        let answered = slot.answered.notified();
        tokio::pin!(answered);
        answered.as_mut().enable();
        if !slot.in_flight() {
            return;
        }
        let _ = tokio::time::timeout(self.wait, answered).await;
    }
}

impl Leasing {
    /// Lease mode's counters and table sizes, for `/stats` and `/metrics`: (name, value),
    /// counters first, then the gauges `held_keys`, `held_bytes`, `leased_keys` and
    /// `leased_bytes`.
    pub(in crate::cluster) fn stats(&self) -> Vec<(&'static str, u64)> {
        let mut out = self.client.stats_snapshot();
        if let Some(server) = self.owner.leases() {
            out.push(("grants", server.grants.load(Ordering::Relaxed)));
            out.push(("refused", server.refused.load(Ordering::Relaxed)));
            out.push(("held_keys", self.client.len() as u64));
            out.push(("held_bytes", self.client.bytes() as u64));
            out.push(("leased_keys", server.len() as u64));
            out.push(("leased_bytes", server.bytes() as u64));
        }
        if let Some(parent) = self.owner.parent() {
            let up = &parent.upstream;
            let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
            // Counters before gauges, as the caller reads them.
            let gauges_at = out.len() - 4.min(out.len());
            let counters = [
                ("parent_calls", load(&up.stats.calls)),
                ("parent_failures", load(&up.stats.failures)),
                ("parent_asks", load(&up.stats.asks)),
                ("parent_safe_answers", load(&up.stats.safe_answers)),
            ];
            out.splice(gauges_at..gauges_at, counters);
            out.push(("parent_keys", up.len() as u64));
            out.push(("parent_bytes", up.bytes() as u64));
            out.push(("parent_unreachable", u64::from(up.unreachable())));
            out.push(("parent_never_reached", u64::from(!up.reached())));
        }
        out
    }

    /// `key`'s leases as this node sees them.
    pub(in crate::cluster) fn view(&self, key: &str) -> KeyView {
        let members = self.members.load();
        let now = self.clock.now();
        KeyView {
            key: key.to_owned(),
            node: self.advertise.clone(),
            owner: members.ring().addr(members.owner(key)).to_owned(),
            held: self.client.holding(key),
            holders: self
                .owner
                .leases()
                .map(|s| s.holders(key, now))
                .unwrap_or_default(),
            parent: self.owner.parent().and_then(|p| p.view(key)),
        }
    }
}
