//! The peer cluster: every counter key has one owner among the Sluice peers, picked by
//! rendezvous hashing ([`ring`]); the owner keeps the counter in its memory store and the
//! other peers forward hits to it ([`peer`]), batched per peer.
//!
//! - **Membership**: PEERS (static) or PEERS_DNS (re-resolved every 5 s). A peer whose call
//!   fails or misses SLUICE_PEER_TIMEOUT_MS, or a probe (every 500 ms), is marked down and its
//!   keys go to their next-best owner at once; it comes back when a probe is answered.
//! - **What a request gets while an owner is unreachable**: its hits are retried once on the
//!   next owner (often this node), so the answer comes within two peer deadlines and limits
//!   keep applying, on a counter that starts from the new owner's count.
//! - **Divided mode** (SLUICE_CLUSTER_MODE=divided, Cortex's global limiter): no forwarding;
//!   each node enforces `ceil(limit / live peers)` locally. A concurrency limit is forwarded to
//!   its owner in every mode: a request's start and its end's refund must meet.
//! - **Durability** (SLUICE_PEER_WRITE_BEHIND, [`durable`]): owners write their counters behind
//!   to Redis and a node that takes a key over loads its count first. Every hit this node
//!   applies as an owner, its own or forwarded, goes through [`OwnerStore`] for that.
//! - **Joins** ([`join`]): a node that joins (or restarts) relays the hits of the keys it takes
//!   on to their previous owner while that owner's count of their window still matters, so one
//!   counter counts each window. Done in [`OwnerStore`], which both this node's own hits and
//!   forwarded ones go through.
//! - **Protocol** ([`peer`], `proto/sluice/peer/v1/peer.proto`): versioned; a peer speaking
//!   another version refuses this node's calls, so each sees the other as down and a
//!   mixed-version cluster splits by version until the upgrade ends (docs/cluster.md).
//! - **Security** (SLUICE_PEER_TLS): the peer listener and every call to a peer, probes
//!   included, use mutual TLS with one certificate, re-read when its files change.
//! - **Runtime limits** ([`runtime_peers`]): every node holds them all; changes are pushed to
//!   every peer, a node reconciles with a peer when it first answers or answers again, and
//!   every SLUICE_RUNTIME_LIMITS_SYNC_MS compares digests with one peer (anti-entropy).

mod config;
pub mod durable;
pub mod join;
pub mod lease;
mod lease_driver;
pub mod lease_parent;
mod minority;
pub mod peer;
pub mod ring;
pub(crate) mod rlqs_peers;
pub mod runtime_peers;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::clock::{Clock, Timestamp};
use crate::config::ConfigHandle;
use crate::limiter::{CounterKind, Decision, Quota};
use crate::store::{Cause, CounterStore, Hit, MemoryStore, StoreError};
use crate::tls::PeerTls;
pub use config::{ClusterConfig, ClusterMode, ParentConfig, PeerSource, WriteBehind};
use durable::{Durable, RingChanges};
use join::{Joining, Relay};
use lease::LeaseServer;
use peer::{Malformed, Op, PeerClient, PeerDecision, PeerError, PeerHit};
use ring::{Ring, key_hash};
use runtime_peers::PeerLimits;

/// Peers that answered first or again, waiting for the runtime limits to reconcile with them;
/// past it one is dropped, and the anti-entropy pass finds what it would have brought.
const RETURNED_QUEUE: usize = 1024;

/// The peers as currently known: the ring, a client per remote peer, and who is down.
struct Members {
    ring: Ring,
    /// Index of this node in the ring.
    me: usize,
    clients: Vec<Option<PeerClient>>,
    /// A second client per remote peer, for a joining node's relays ([`join`]): its own
    /// connection and batching queue, so relays never wait behind forwards, which may
    /// themselves wait on relays at their owner.
    relay_clients: Vec<Option<PeerClient>>,
    down: Vec<AtomicBool>,
}

/// What a client for each remote peer is made from, whenever the peers change.
#[derive(Clone)]
struct Dialer {
    /// This node's address among the peers, the deadline and the batch window.
    settings: ClusterConfig,
    /// SLUICE_PEER_TLS.
    tls: Option<PeerTls>,
    stats: Arc<ClusterStats>,
}

/// Why a peer cluster could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// PEER_ADVERTISE_ADDRESS is not on the ring built from PEERS and itself (a bug: it is
    /// always added).
    #[error("{0} is not among the peers")]
    NotAPeer(String),
    /// A peer's address or the peer TLS refused a client.
    #[error(transparent)]
    Peer(#[from] PeerError),
    /// A client for a SLUICE_LEASE_PARENT peer.
    #[error("SLUICE_LEASE_PARENT: {0}")]
    Parent(PeerError),
    /// SLUICE_PEER_WRITE_BEHIND's Redis client.
    #[error(transparent)]
    WriteBehind(#[from] StoreError),
}

impl Members {
    fn build(addrs: Vec<String>, dialer: &Dialer) -> Result<Self, StartError> {
        let me = &dialer.settings.advertise;
        let ring = Ring::new(addrs.into_iter().chain([me.clone()]));
        let me_index = ring
            .index_of(me)
            .ok_or_else(|| StartError::NotAPeer(me.clone()))?;
        let clients = Self::dial(&ring, me_index, dialer)?;
        let relay_clients = Self::dial(&ring, me_index, dialer)?;
        let down = (0..ring.len()).map(|_| AtomicBool::new(false)).collect();
        Ok(Members {
            ring,
            me: me_index,
            clients,
            relay_clients,
            down,
        })
    }

    /// A client for each peer of `ring` but this node (`me`); each connects at its first call.
    fn dial(
        ring: &Ring,
        me: usize,
        dialer: &Dialer,
    ) -> Result<Vec<Option<PeerClient>>, StartError> {
        ring.addrs()
            .enumerate()
            .map(|(i, a)| {
                (i != me)
                    .then(|| {
                        PeerClient::start(
                            a,
                            dialer.settings.timeout,
                            dialer.settings.batch_window,
                            dialer.tls.as_ref(),
                            dialer.stats.clone(),
                        )
                        .map(|c| c.with_lease_wait(dialer.settings.parent_wait()))
                    })
                    .transpose()
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(StartError::Peer)
    }

    fn owner(&self, key: &str) -> usize {
        let h = key_hash(key);
        self.ring
            .owner(h, |i| i == self.me || !self.down[i].load(Ordering::Relaxed))
            .unwrap_or(self.me)
    }

    /// The key's owner among the peers believed up other than this node: where its counter was
    /// before this node joined ([`join`]).
    fn previous_owner(&self, key: &str) -> Option<usize> {
        self.ring.owner(key_hash(key), |i| {
            i != self.me && !self.down[i].load(Ordering::Relaxed)
        })
    }

    /// Whether the key's owner among all peers, up or not, is another node.
    fn owned_elsewhere(&self, key: &str) -> bool {
        self.ring.owner(key_hash(key), |_| true) != Some(self.me)
    }

    /// Marks the peer `owner` down after a failed call (`error`), recording the ring change;
    /// one log line when it goes down, not one per failed call.
    fn failed(&self, owner: usize, error: &PeerError, changes: &RingChanges, now: Timestamp) {
        if !self.down[owner].swap(true, Ordering::Relaxed) {
            tracing::warn!(peer = self.ring.addr(owner), error = %error, "peer failed; marking it down");
            changes.record(now);
            self.warn_if_alone();
        }
    }

    /// One log line when a peer marked down leaves this node without a majority.
    fn warn_if_alone(&self) {
        if !self.has_quorum() {
            tracing::warn!(
                live = self.live(),
                peers = self.ring.len(),
                "this node reaches no majority of its peers: it decides alone, within each \
                 limit's safe capacity, until they answer again"
            );
        }
    }

    /// Whether this node reaches a majority of the peers it knows, itself included. Without
    /// one it may be on the small side of a partition, whose other side goes on with the keys:
    /// it decides alone, within each limit's safe capacity ([`minority`]).
    fn has_quorum(&self) -> bool {
        self.live() * 2 > self.ring.len()
    }

    fn live(&self) -> usize {
        (0..self.ring.len())
            .filter(|&i| i == self.me || !self.down[i].load(Ordering::Relaxed))
            .count()
    }
}

/// This node's counters as an owner: the memory store, plus, with SLUICE_PEER_WRITE_BEHIND,
/// the take-over loads before hits are applied and the write-behind marks after. Both this
/// node's own hits and the hits peers forward to it go through here.
pub struct OwnerStore {
    local: Arc<MemoryStore>,
    durable: Option<Arc<Durable>>,
    members: Arc<ArcSwap<Members>>,
    /// Lease mode: this node's lease server for the keys it owns.
    leases: Option<Arc<LeaseServer>>,
    /// SLUICE_LEASE_FREE_SHARE_PERCENT in parts per million: what the permits this node gives
    /// as an owner share among the ring's nodes.
    free_share_ppm: u64,
    /// SLUICE_LEASE_PARENT: where the lease server's capacity comes from.
    parent: Option<Arc<lease_parent::ParentLink>>,
    changes: Arc<RingChanges>,
    /// When this node's join settled, for the keys it relays to their previous owner.
    join: Arc<Joining>,
    /// A relay's deadline: half the peers' (a relay often runs inside a call a peer forwarded,
    /// which must not miss its own deadline, as for a take-over load).
    relay_timeout: Duration,
    stats: Arc<ClusterStats>,
}

impl OwnerStore {
    pub fn local(&self) -> &Arc<MemoryStore> {
        &self.local
    }

    pub fn durable(&self) -> Option<&Arc<Durable>> {
        self.durable.as_ref()
    }

    pub fn leases(&self) -> Option<&Arc<LeaseServer>> {
        self.leases.as_ref()
    }

    pub fn parent(&self) -> Option<&Arc<lease_parent::ParentLink>> {
        self.parent.as_ref()
    }

    /// Answers `node`'s lease asks as this node's lease server; `None` when not in lease mode.
    /// Below a parent, each key gets at most what the parent granted this cluster, and keys
    /// the parent granted nothing for in the window are asked of it first (a bounded wait).
    pub async fn answer_leases<K: AsRef<str>>(
        &self,
        node: &str,
        asks: &[(K, lease::Ask)],
        now: Timestamp,
    ) -> Option<Vec<lease::Grant>> {
        let server = self.leases.as_ref()?;
        let mut now = now;
        let capacities = match &self.parent {
            Some(parent) => parent.capacities(server, asks, &mut now).await,
            None => vec![lease::Capacity::default(); asks.len()],
        };
        let members = self.members.load();
        let live = members.live();
        let (_, last_change) = self.changes.last();
        server.peer_returned(self.changes.last_return());
        Some(
            asks.iter()
                .zip(capacities)
                .map(|((key, ask), capacity)| {
                    let key = key.as_ref();
                    // A stand-in for a key's owner (the owner among every peer this node knows
                    // is another one) may not have seen the change that sent the key here: it
                    // rebuilds the key as after one.
                    let since = if members.owned_elsewhere(key) {
                        now
                    } else {
                        last_change
                    };
                    server.answer_within(node, key, ask, capacity, now, since, live)
                })
                .collect(),
        )
    }
}

impl OwnerStore {
    /// A permit for free shares for `node` at `now` ([`lease::free`]): its equal part of
    /// SLUICE_LEASE_FREE_SHARE_PERCENT of each limit over the ring's size. `None` outside lease
    /// mode, with free shares off, or below a parent (whose grant per window may be less than
    /// the limit).
    pub fn permit(&self, node: &str, now: Timestamp) -> Option<lease::free::Permit> {
        let server = self.leases.as_ref()?;
        let share = self.free_share_ppm;
        if share == 0 || self.parent.is_some() {
            return None;
        }
        let ring = u64::try_from(self.members.load().ring.len().max(1)).unwrap_or(u64::MAX);
        server.permits.give(node, now.micros(), share / ring)
    }

    /// The keys recalled from `node`'s free shares since its last call ([`lease::free`]).
    pub fn recalls(&self, node: &str) -> Vec<lease::free::Recall> {
        self.leases
            .as_ref()
            .map(|server| server.permits.take_recalls(node))
            .unwrap_or_default()
    }
}

/// What an owner answers for one hit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Served {
    /// Its decision.
    Decided(Decision),
    /// A [`Relay::Take`] hit: this node's state of the counter, as a window index and the
    /// values [`CounterKind::parts`] gives (none: it holds nothing), and when the key's
    /// penalty ends (`penalty_seconds`), if one is in force. Nothing was applied.
    Taken(u64, Vec<u64>, Option<Timestamp>),
}

impl OwnerStore {
    /// Answers `op` on `hits` as their owner: here, or, for a key this node took on by joining
    /// whose count its previous owner keeps, there ([`join`]). `relay[i]` says how hit `i`
    /// reached this node (missing: [`Relay::No`]); a relayed hit is answered here, whatever
    /// the ring says. One answer per hit for a charge or a refund, none for a reset.
    pub async fn serve(
        &self,
        op: Op,
        now: Timestamp,
        hits: &[Hit<'_>],
        relay: &[Relay],
    ) -> Result<Vec<Served>, StoreError> {
        let members = self.members.load();
        let mut answers: Vec<Option<Served>> = vec![None; hits.len()];
        let mut here = Vec::with_capacity(hits.len());
        let mut relays: Vec<(usize, Vec<(usize, Relay)>)> = Vec::new();
        for (i, hit) in hits.iter().enumerate() {
            match relay.get(i).copied().unwrap_or_default() {
                Relay::Apply => here.push(i),
                Relay::Take => answers[i] = Some(self.hand_over(hit, now).await?),
                Relay::No => match self.relay_to(&members, hit, now) {
                    Some((to, how)) => {
                        // A reset forgets the count wherever it is.
                        let how = if op == Op::Reset {
                            here.push(i);
                            Relay::Apply
                        } else {
                            how
                        };
                        match relays.iter_mut().find(|(t, _)| *t == to) {
                            Some((_, idx)) => idx.push((i, how)),
                            None => relays.push((to, vec![(i, how)])),
                        }
                    }
                    None => here.push(i),
                },
            }
        }
        self.relay_all(
            &members,
            (op, now),
            hits,
            &relays,
            (&mut answers, &mut here),
        )
        .await;
        here.sort_unstable();
        let mine: Vec<Hit<'_>> = here.iter().map(|&i| hits[i]).collect();
        let mut out = Vec::with_capacity(mine.len());
        self.apply_here(op, now, &mine, &mut out).await?;
        for (&i, d) in here.iter().zip(out) {
            answers[i] = Some(Served::Decided(d));
        }
        Ok(answers.into_iter().flatten().collect())
    }

    /// The relays of [`OwnerStore::serve`], all at once: a decision from the previous owner is
    /// the hit's answer; a counter it hands over is merged here and the hit goes `here`; a
    /// failed relay marks it down and sends its hits `here` (its count is lost with it: the
    /// owner-change bound).
    async fn relay_all(
        &self,
        members: &Members,
        (op, now): (Op, Timestamp),
        hits: &[Hit<'_>],
        relays: &[(usize, Vec<(usize, Relay)>)],
        (answers, here): (&mut [Option<Served>], &mut Vec<usize>),
    ) {
        let calls = relays
            .iter()
            .map(|(to, idx)| self.relay(members, *to, op, hits, idx));
        let results = futures_util::future::join_all(calls).await;
        for ((to, idx), result) in relays.iter().zip(results) {
            let got = match result {
                Ok(got) => got,
                Err(PeerError::Timeout { .. }) => {
                    self.stats.failed_relays.fetch_add(1, Ordering::Relaxed);
                    self.relay_late(op, now, hits, idx, answers, here);
                    continue;
                }
                Err(e) => {
                    self.stats.failed_relays.fetch_add(1, Ordering::Relaxed);
                    members.failed(*to, &e, &self.changes, now);
                    if op != Op::Reset {
                        here.extend(idx.iter().map(|&(i, _)| i));
                    }
                    continue;
                }
            };
            for (&(i, _), answer) in idx.iter().zip(got) {
                match answer {
                    Served::Decided(d) => answers[i] = Some(Served::Decided(d)),
                    Served::Taken(window, values, penalty) => {
                        if let Some(until) = penalty {
                            self.local.keep_penalty(&hits[i], until);
                        }
                        self.take_over(&hits[i], window, &values, now);
                        here.push(i);
                    }
                }
            }
        }
    }

    /// The hits at `idx`, whose relay missed its deadline. Not a reason to mark the previous
    /// owner down: a relay's deadline is half a forward's and relays come in floods (every
    /// key's first hit after a start), so a late answer says that owner is busy, not gone (its
    /// probes tell, and a refused connection marks it down at once). Nor to count the hits
    /// here: that owner keeps the key's count, which this node would start again from 0 (up
    /// to twice the limit). So a charge is refused, never over the limit; a refund is given
    /// back here, where it finds nothing to give back (the count stays there: stricter); a
    /// reset was applied here already.
    fn relay_late(
        &self,
        op: Op,
        now: Timestamp,
        hits: &[Hit<'_>],
        idx: &[(usize, Relay)],
        answers: &mut [Option<Served>],
        here: &mut Vec<usize>,
    ) {
        for &(i, _) in idx {
            match op {
                Op::Apply => answers[i] = Some(Served::Decided(refused(&hits[i], now))),
                Op::Refund => here.push(i),
                Op::Reset => {}
            }
        }
    }

    /// Whether this node holds the counter of `hit` at `now` (a count in its horizon).
    fn holds(&self, hit: &Hit<'_>, now: Timestamp) -> bool {
        CounterKind::of_quota(&hit.quota).is_some_and(|k| self.local.holds(k, hit.key, now))
    }

    /// Where a hit on a key this node owns goes while its previous owner keeps the key's count:
    /// that owner and how ([`Joining::relay`]); `None` to count it here (a key this node stands
    /// in for, one whose counter it holds already, or no other peer up).
    fn relay_to(&self, members: &Members, hit: &Hit<'_>, now: Timestamp) -> Option<(usize, Relay)> {
        let how = self.join.relay(&hit.quota, now)?;
        if members.owner(hit.key) != members.me || self.holds(hit, now) {
            return None;
        }
        Some((members.previous_owner(hit.key)?, how))
    }

    /// This node's state of the counter of `hit`, handed to a newcomer taking it over, and
    /// forgotten here: the newcomer counts on from it, and a later take (its count refunded to
    /// nothing, say) must not bring it back (the store contract's
    /// `a_count_taken_over_then_refunded_stays_refunded`). A take whose answer came too late
    /// for the newcomer (which refused the hit) leaves the count with neither: the owner-change
    /// bound (docs/cluster.md, "A node joining").
    /// The key's penalty goes with it (kept here too: no other node asks for it).
    async fn hand_over(&self, hit: &Hit<'_>, now: Timestamp) -> Result<Served, StoreError> {
        let penalty = self.local.penalty_until(hit, now);
        let parts = CounterKind::of_quota(&hit.quota).and_then(|kind| {
            let state = self.local.state(kind, hit.key)?;
            kind.holds(state, now).then(|| kind.parts(state, now))
        });
        let Some((window, values)) = parts else {
            return Ok(Served::Taken(0, Vec::new(), penalty));
        };
        self.local.reset(now, std::slice::from_ref(hit)).await?;
        Ok(Served::Taken(window, values, penalty))
    }

    /// Merges the counter a previous owner handed over into this node's.
    fn take_over(&self, hit: &Hit<'_>, window: u64, values: &[u64], now: Timestamp) {
        let Some(kind) = CounterKind::of_quota(&hit.quota) else {
            return;
        };
        let Some(state) = kind.from_parts(window, values, now) else {
            return;
        };
        self.stats.taken_over.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.local.merge_max(kind, hit.key, state, now) {
            tracing::debug!(error = %e, "cannot keep a count taken over");
        }
    }

    /// Relays the hits at `idx` to `to`, within [`OwnerStore::relay_timeout`]: one answer
    /// each for a charge or a refund.
    async fn relay(
        &self,
        members: &Members,
        to: usize,
        op: Op,
        hits: &[Hit<'_>],
        idx: &[(usize, Relay)],
    ) -> Result<Vec<Served>, PeerError> {
        let client = members.relay_clients[to]
            .as_ref()
            .ok_or(PeerError::NoClient("no client for the peer"))?;
        let wire = idx
            .iter()
            .map(|&(i, how)| PeerHit::relayed(&hits[i], how))
            .collect();
        self.stats
            .relayed_hits
            .fetch_add(idx.len() as u64, Ordering::Relaxed);
        let answer = tokio::time::timeout(self.relay_timeout, client.apply(wire, op))
            .await
            .unwrap_or(Err(PeerError::Timeout {
                after: self.relay_timeout,
            }))?;
        if !op.answers() {
            return Ok(Vec::new());
        }
        // A refund on an owner older than refunds' answers: peeked at later, as for a forward.
        if answer.is_empty() && op.may_answer_nothing() {
            return Ok(vec![Served::Decided(UNANSWERED); idx.len()]);
        }
        if answer.len() != idx.len() {
            return Err(PeerError::Malformed(Malformed::Decisions {
                got: answer.len(),
                hits: idx.len(),
            }));
        }
        Ok(answer.into_iter().map(Served::from).collect())
    }

    /// Applies `op` to `hits` on this node's counters: with write-behind, loaded first if this
    /// node may have taken them over, and marked for the next flush after.
    async fn apply_here(
        &self,
        op: Op,
        now: Timestamp,
        hits: &[Hit<'_>],
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        if hits.is_empty() {
            return Ok(());
        }
        match op {
            Op::Apply => self.charge_here(now, hits, out).await,
            // A refund is written behind too: the next flush takes the refunded hits off the
            // copy in Redis (see [`Durable::mark_refunded`]).
            Op::Refund => {
                self.local.refund(now, hits, out).await?;
                if let Some(durable) = &self.durable {
                    durable.mark_refunded(now, hits);
                }
                Ok(())
            }
            // A reset is not written behind either: Redis keeps the old count until the
            // write-behind next writes the key, and a later owner taking the key over loads it
            // (the counter admin's docs say so).
            Op::Reset => self.local.reset(now, hits).await,
        }
    }

    async fn charge_here(
        &self,
        now: Timestamp,
        hits: &[Hit<'_>],
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        let Some(durable) = &self.durable else {
            return self.local.apply(now, hits, out).await;
        };
        let members = self.members.load();
        durable
            .take_over(now, hits, |key| members.owned_elsewhere(key))
            .await;
        self.local.apply(now, hits, out).await?;
        durable.mark_dirty(hits);
        Ok(())
    }

    /// [`OwnerStore::serve`] for this node's own hits, whose answers are all decisions.
    async fn serve_all(
        &self,
        op: Op,
        now: Timestamp,
        hits: &[Hit<'_>],
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        for answer in self.serve(op, now, hits, &[]).await? {
            if let Served::Decided(d) = answer {
                out.push(d);
            }
        }
        Ok(())
    }
}

/// A charge of `hit` refused without counting it anywhere: what a fixed window of 0 answers
/// in the limit's window (its time to reset: to the window's end, a bound for a bucket too).
fn refused(hit: &Hit<'_>, now: Timestamp) -> Decision {
    let none = Quota {
        requests_per_unit: 0,
        algorithm: crate::limiter::Algorithm::FixedWindow,
        burst: None,
        ..hit.quota
    };
    let (mut d, _) = crate::limiter::counter::decide(&none, 0, now, hit.hits.max(1));
    d.over = true;
    d.remaining = 0;
    d
}

/// A previous owner's answer to a relayed hit: the counter it hands over, or (applied there,
/// or an owner older than takes) its decision.
impl From<PeerDecision> for Served {
    fn from(d: PeerDecision) -> Self {
        match d.taken {
            Some(state) => Served::Taken(
                state.window,
                state.values,
                (state.penalty_until_us > 0)
                    .then(|| Timestamp::from_micros(state.penalty_until_us)),
            ),
            None => Served::Decided(Decision::from(d)),
        }
    }
}

impl CounterStore for OwnerStore {
    async fn apply<'a>(
        &'a self,
        now: Timestamp,
        hits: &'a [Hit<'a>],
        out: &'a mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        self.serve_all(Op::Apply, now, hits, out).await
    }

    async fn refund<'a>(
        &'a self,
        now: Timestamp,
        hits: &'a [Hit<'a>],
        out: &'a mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        self.serve_all(Op::Refund, now, hits, out).await
    }

    async fn reset<'a>(&'a self, now: Timestamp, hits: &'a [Hit<'a>]) -> Result<(), StoreError> {
        self.serve_all(Op::Reset, now, hits, &mut Vec::new()).await
    }
}

/// A counter store spread over the peers; this node's share lives in `owner`.
pub struct ClusterStore {
    local: Arc<MemoryStore>,
    owner: Arc<OwnerStore>,
    changes: Arc<RingChanges>,
    members: Arc<ArcSwap<Members>>,
    mode: ClusterMode,
    stats: Arc<ClusterStats>,
    /// Lease mode: the leases this node holds, and how it asks for them.
    lease: Option<Arc<lease_driver::Leasing>>,
    /// The peers that answered for the first time or again after being down, for the runtime
    /// limits to pull from; taken by [`ClusterStore::runtime_limits`].
    returned: std::sync::Mutex<Option<tokio::sync::mpsc::Receiver<String>>>,
    /// PEERS names no node but this one: there is no peer to wait for.
    alone: bool,
    clock: Arc<dyn Clock>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// What the cluster did, for `/stats` and the benchmark.
#[derive(Debug, Default)]
pub struct ClusterStats {
    /// Hits applied to this node's own counters (its keys, or a dead owner's it took over).
    pub local_hits: AtomicU64,
    /// Hits sent to their owner on another peer.
    pub forwarded_hits: AtomicU64,
    /// Calls made to peers (each carries a batch of forwarded hits; probes excluded).
    pub peer_calls: AtomicU64,
    /// Forwards that failed and were retried on the next owner.
    pub failed_forwards: AtomicU64,
    /// Hits this node decided alone while it reached no majority of its peers (no split
    /// brain: [`minority`]).
    pub alone_hits: AtomicU64,
    /// Hits on keys this node took on by joining, sent to their previous owner: applied there
    /// until the join settled, then to take the counter over ([`join`]).
    pub relayed_hits: AtomicU64,
    /// Relays that failed: their hits were counted here, and the peer marked down.
    pub failed_relays: AtomicU64,
    /// Counters taken over from a previous owner that held a count of them.
    pub taken_over: AtomicU64,
}

impl Drop for ClusterStore {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl ClusterStore {
    /// Starts membership (and, for PEERS_DNS, its resolver, and with SLUICE_PEER_WRITE_BEHIND
    /// the write-behind). With `tls` (SLUICE_PEER_TLS), every call to a peer is made over
    /// mutual TLS. Inside a tokio runtime.
    pub fn start(
        local: Arc<MemoryStore>,
        settings: &ClusterConfig,
        tls: Option<PeerTls>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StartError> {
        let stats = Arc::new(ClusterStats::default());
        let tls_parent = tls.clone();
        let dialer = Dialer {
            settings: settings.clone(),
            tls,
            stats: stats.clone(),
        };
        let members = Arc::new(ArcSwap::from_pointee(Members::build(
            settings.peers.initial(),
            &dialer,
        )?));
        let alone =
            matches!(settings.peers, PeerSource::Static(_)) && members.load().ring.len() == 1;
        // Starting is a change: whatever this node owns now, others may have counted before.
        let changes = Arc::new(RingChanges::new(clock.now()));
        let join = Arc::new(joining(&settings.peers, clock.now()));
        let (returned_tx, returned) = tokio::sync::mpsc::channel(RETURNED_QUEUE);
        let mut tasks = membership_tasks(&members, dialer, (&changes, &join, returned_tx), &clock);
        let durable = match &settings.write_behind {
            Some(wb) => {
                let d = start_durable(settings, wb, &local, &changes)?;
                tasks.push(d.spawn_flusher(clock.clone(), wb.interval));
                Some(d)
            }
            None => None,
        };
        let lease_mode = settings.mode == ClusterMode::Lease;
        let leases = lease_mode.then(|| Arc::new(LeaseServer::new(settings.lease)));
        let tools = (stats.clone(), clock.clone());
        let server = (leases.as_ref(), owns(&members));
        let parent = lease_parent::ParentLink::spawn(settings, server, tls_parent, tools)?.map(
            |(link, task)| {
                tasks.push(task);
                link
            },
        );
        let owner = Arc::new(OwnerStore {
            local: local.clone(),
            durable,
            members: members.clone(),
            leases,
            free_share_ppm: settings.lease.free_share_ppm,
            parent,
            changes: changes.clone(),
            join,
            relay_timeout: settings.timeout / 2,
            stats: stats.clone(),
        });
        let lease = lease_mode.then(|| {
            let l = lease_driver::Leasing::new(
                settings,
                owner.clone(),
                members.clone(),
                changes.clone(),
                clock.clone(),
            );
            let l = Arc::new(l);
            tasks.extend(l.spawn());
            l
        });
        Ok(ClusterStore {
            local,
            owner,
            changes,
            members,
            mode: settings.mode,
            stats,
            lease,
            returned: std::sync::Mutex::new(Some(returned)),
            alone,
            clock,
            tasks,
        })
    }

    /// The runtime limits among the peers: the `Limits` call's owner side and the pushes of
    /// this node's changes; it reconciles with each peer that answers first or again, and
    /// compares digests with a peer every `sync`. Once: `None` after the first call.
    pub fn runtime_limits(&self, config: ConfigHandle, sync: Duration) -> Option<Arc<PeerLimits>> {
        let returned = self
            .returned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()?;
        let limits = PeerLimits::new(config, self.members.clone(), returned, sync);
        if self.alone {
            limits.mark_loaded();
        }
        Some(limits)
    }

    pub fn local(&self) -> &Arc<MemoryStore> {
        &self.local
    }

    /// This node's counters as an owner, for the peer listener.
    pub fn owner(&self) -> &Arc<OwnerStore> {
        &self.owner
    }

    pub fn stats(&self) -> &ClusterStats {
        &self.stats
    }

    /// The peers for the Rate Limit Quota Service: its buckets' owners on this ring, reached
    /// over the peer protocol's `Quota` call.
    pub fn rlqs_peers(&self, clock: Arc<dyn Clock>) -> Arc<dyn crate::rlqs::QuotaPeers> {
        Arc::new(rlqs_peers::ClusterQuota {
            members: self.members.clone(),
            changes: self.changes.clone(),
            clock,
        })
    }

    /// Whether this node's join has yet to settle: some peer may still route its keys elsewhere,
    /// and it relays them to their previous owner ([`join`]).
    pub fn joining(&self) -> bool {
        self.owner
            .join
            .settled()
            .is_none_or(|settled| self.clock.now() < settled)
    }

    /// Whether this node reaches a majority of its peers, itself included (otherwise it decides
    /// alone, within each limit's safe capacity).
    pub fn has_majority(&self) -> bool {
        self.members.load().has_quorum()
    }

    /// The peer addresses and whether each is up, for the debug listener.
    pub fn peers(&self) -> Vec<(String, bool)> {
        let m = self.members.load();
        m.ring
            .addrs()
            .enumerate()
            .map(|(i, a)| {
                (
                    a.to_owned(),
                    i == m.me || !m.down[i].load(Ordering::Relaxed),
                )
            })
            .collect()
    }

    /// Applies (or refunds) `hits` where their counters live: on this node's share of the
    /// limit in divided mode, else on each key's owner, retried once on the next owners for
    /// the hits whose owner failed.
    async fn route(
        &self,
        now: Timestamp,
        hits: &[Hit<'_>],
        op: Op,
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        let members = self.members.load_full();
        if !members.has_quorum() {
            return self.route_minority(&members, now, hits, op, out).await;
        }
        match self.mode {
            ClusterMode::Divided if hits.iter().any(is_slots) => {
                return self
                    .route_divided_with_slots(&members, now, hits, op, out)
                    .await;
            }
            ClusterMode::Divided => {
                return self.route_divided(&members, now, hits, op, out).await;
            }
            ClusterMode::Lease => return self.route_lease(&members, now, hits, op, out).await,
            ClusterMode::Forward => {}
        }
        self.route_forward(&members, now, hits, op, out).await
    }

    /// Forward mode: each hit applied on its key's owner.
    async fn route_forward(
        &self,
        members: &Members,
        now: Timestamp,
        hits: &[Hit<'_>],
        op: Op,
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        let mut decisions: Vec<Option<Decision>> = vec![None; hits.len()];
        // Two rounds: the owners as known now, then (for hits whose owner failed) the next
        // owners once the failed peers are marked down. The second round may be this node.
        for round in 0..2 {
            let pending: Vec<usize> = (0..hits.len())
                .filter(|&i| decisions[i].is_none())
                .collect();
            if pending.is_empty() {
                break;
            }
            if round == 1 && !members.has_quorum() {
                self.decide_alone(members, now, hits, &pending, op, &mut decisions)
                    .await?;
                break;
            }
            let groups = by_owner(members, hits, pending);
            let calls = groups.iter().map(|(owner, idx)| {
                let mine: Vec<Hit<'_>> = idx.iter().map(|&i| hits[i]).collect();
                self.call_owner(members, *owner, mine, now, op)
            });
            let results = futures_util::future::join_all(calls).await;
            for ((_, idx), result) in groups.iter().zip(results) {
                place(&mut decisions, idx, result, op, round == 1)?;
            }
        }
        if op == Op::Refund {
            self.peek_unanswered(members, now, hits, &mut decisions)
                .await?;
        }
        if op.answers() {
            out.extend(decisions.into_iter().flatten());
        }
        Ok(())
    }

    /// The hits at `pending`, whose owners failed in the first round and left this node
    /// without a majority (the peers it marked down then, and before): decided alone, within
    /// the safe capacity, as every later hit is until a peer answers again. Their next owner
    /// would be this node, standing in with the whole limit, which a node on the small side
    /// of a partition must not do (the majority side takes the keys over); under load it is
    /// also what a node of the majority side that missed the owner's deadline would do.
    async fn decide_alone(
        &self,
        members: &Members,
        now: Timestamp,
        hits: &[Hit<'_>],
        pending: &[usize],
        op: Op,
        decisions: &mut [Option<Decision>],
    ) -> Result<(), StoreError> {
        let alone: Vec<Hit<'_>> = pending.iter().map(|&i| hits[i]).collect();
        let mut decided = Vec::with_capacity(alone.len());
        self.route_minority(members, now, &alone, op, &mut decided)
            .await?;
        let mut decided = decided.into_iter();
        for &i in pending {
            decisions[i] = Some(decided.next().unwrap_or(UNANSWERED));
        }
        Ok(())
    }

    /// The refunds an owner older than refunds' answers gave back without a decision
    /// ([`Unanswered`]): asked again as charges of 0 hits, which count nothing.
    async fn peek_unanswered(
        &self,
        members: &Members,
        now: Timestamp,
        hits: &[Hit<'_>],
        decisions: &mut [Option<Decision>],
    ) -> Result<(), StoreError> {
        let unanswered: Vec<usize> = (0..hits.len())
            .filter(|&i| decisions[i] == Some(UNANSWERED))
            .collect();
        if unanswered.is_empty() {
            return Ok(());
        }
        let peeks: Vec<Hit<'_>> = unanswered
            .iter()
            .map(|&i| Hit { hits: 0, ..hits[i] })
            .collect();
        let mut answered = Vec::with_capacity(peeks.len());
        Box::pin(self.route_forward(members, now, &peeks, Op::Apply, &mut answered)).await?;
        for (&i, d) in unanswered.iter().zip(answered) {
            decisions[i] = Some(d);
        }
        Ok(())
    }

    /// Divided mode with concurrency limits among the hits: those go to their keys' owners (a
    /// request's start and its end's refund may reach different nodes, and must meet), the
    /// others are divided; the decisions are put back in the hits' order.
    async fn route_divided_with_slots(
        &self,
        members: &Members,
        now: Timestamp,
        hits: &[Hit<'_>],
        op: Op,
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        let (slots, shares): (Vec<Hit<'_>>, Vec<Hit<'_>>) = hits.iter().partition(|h| is_slots(h));
        let (mut owned, mut divided) = (Vec::new(), Vec::new());
        self.route_forward(members, now, &slots, op, &mut owned)
            .await?;
        self.route_divided(members, now, &shares, op, &mut divided)
            .await?;
        let (mut owned, mut divided) = (owned.into_iter(), divided.into_iter());
        for h in hits {
            let next = if is_slots(h) {
                owned.next()
            } else {
                divided.next()
            };
            out.extend(next);
        }
        Ok(())
    }

    /// Divided mode: each node enforces its share of the limit locally.
    async fn route_divided(
        &self,
        members: &Members,
        now: Timestamp,
        hits: &[Hit<'_>],
        op: Op,
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        let live = u32::try_from(members.live()).unwrap_or(u32::MAX).max(1);
        let shared: Vec<Hit<'_>> = hits
            .iter()
            .map(|h| {
                let mut q = h.quota;
                q.requests_per_unit = q.requests_per_unit.div_ceil(live);
                Hit { quota: q, ..*h }
            })
            .collect();
        match op {
            Op::Apply => self.local.apply(now, &shared, out).await,
            Op::Refund => self.local.refund(now, &shared, out).await,
            Op::Reset => self.local.reset(now, &shared).await,
        }
    }

    /// The hits `mine` on their owner `owner`: this node's owner store, or a forward. A failed
    /// forward marks the peer down and is [`OwnerFailed::Peer`], to be retried on the next
    /// owner; the local store's own errors are [`OwnerFailed::Local`], final.
    async fn call_owner(
        &self,
        members: &Members,
        owner: usize,
        mine: Vec<Hit<'_>>,
        now: Timestamp,
        op: Op,
    ) -> Result<Vec<Decision>, OwnerFailed> {
        if owner == members.me {
            self.stats
                .local_hits
                .fetch_add(mine.len() as u64, Ordering::Relaxed);
            let mut out = Vec::new();
            let r = match op {
                Op::Apply => self.owner.apply(now, &mine, &mut out).await,
                Op::Refund => self.owner.refund(now, &mine, &mut out).await,
                Op::Reset => self.owner.reset(now, &mine).await,
            };
            return r.map(|()| out).map_err(OwnerFailed::Local);
        }
        let Some(client) = &members.clients[owner] else {
            return Err(OwnerFailed::Peer(PeerError::NoClient(
                "no client for the peer",
            )));
        };
        let wire = mine.iter().map(PeerHit::from_hit).collect();
        self.stats
            .forwarded_hits
            .fetch_add(mine.len() as u64, Ordering::Relaxed);
        match client.apply(wire, op).await {
            Ok(d) => Ok(d.into_iter().map(Decision::from).collect()),
            Err(e) => {
                self.stats.failed_forwards.fetch_add(1, Ordering::Relaxed);
                members.failed(owner, &e, &self.changes, now);
                Err(OwnerFailed::Peer(e))
            }
        }
    }
}

/// This node's join, started at `now` ([`join`]): with PEERS every peer knows it from its start;
/// with PEERS_DNS once their resolution lists it.
fn joining(peers: &PeerSource, now: Timestamp) -> Joining {
    match peers {
        PeerSource::Static(_) => Joining::listed_at_start(now),
        PeerSource::Dns { .. } => Joining::awaiting_dns(),
    }
}

/// SLUICE_PEER_WRITE_BEHIND's write-behind and take-over loads for `local`.
fn start_durable(
    settings: &ClusterConfig,
    wb: &WriteBehind,
    local: &Arc<MemoryStore>,
    changes: &Arc<RingChanges>,
) -> Result<Arc<Durable>, StoreError> {
    // A take-over load runs inside the forwarded call of a peer whose deadline is
    // SLUICE_PEER_TIMEOUT_MS (peers share it, as they share PEERS). Past it, the caller marks
    // this healthy node down and retries on the next owner, which loads too: a stalled Redis
    // then fails every such hit and moves keys about. Half the deadline leaves the other half
    // for the call itself.
    let load_timeout = settings.timeout / 2;
    Durable::new(wb, local.clone(), changes.clone(), load_timeout).map(Arc::new)
}

/// The hits at `pending` grouped by their owner as `members` sees it now, in first-seen order.
fn by_owner(members: &Members, hits: &[Hit<'_>], pending: Vec<usize>) -> Vec<(usize, Vec<usize>)> {
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for i in pending {
        let owner = members.owner(hits[i].key);
        match groups.iter_mut().find(|(o, _)| *o == owner) {
            Some((_, idx)) => idx.push(i),
            None => groups.push((owner, vec![i])),
        }
    }
    groups
}

/// Why an owner gave no decisions for its hits.
enum OwnerFailed {
    /// This node's own store failed: final.
    Local(StoreError),
    /// The call to the peer failed: its hits go to the next owner.
    Peer(PeerError),
}

/// Puts one owner's answer for the hits at `idx` in their places. A failed owner leaves them
/// pending for the next round, or, in the `last` round, fails the request.
fn place(
    decisions: &mut [Option<Decision>],
    idx: &[usize],
    result: Result<Vec<Decision>, OwnerFailed>,
    op: Op,
    last: bool,
) -> Result<(), StoreError> {
    match result {
        // A reset answers nothing, nor does a refund on an owner older than refunds' answers;
        // mark their hits done (the refunds' to be peeked at).
        Ok(d) if !op.answers() || d.is_empty() && op.may_answer_nothing() => {
            idx.iter().for_each(|&i| decisions[i] = Some(UNANSWERED));
        }
        Ok(d) if d.len() == idx.len() => {
            for (&i, d) in idx.iter().zip(d) {
                decisions[i] = Some(d);
            }
        }
        Ok(d) => {
            return Err(StoreError::BadReply {
                expected: idx.len(),
                got: d.len(),
            });
        }
        // The local store's own errors are final.
        Err(OwnerFailed::Local(e)) => return Err(e),
        Err(OwnerFailed::Peer(e)) if last => {
            return Err(StoreError::Peer {
                message: "the owners of some counters did not answer",
                source: Cause::new(e),
            });
        }
        Err(OwnerFailed::Peer(_)) => {}
    }
    Ok(())
}

/// Whether a hit is a concurrency limit's, whose slots live with the key's owner in every mode.
fn is_slots(hit: &Hit<'_>) -> bool {
    hit.quota.algorithm == crate::limiter::Algorithm::Concurrency
}

/// Stands in for the decision of a hit done without one (a reset; a refund on an older owner,
/// to be peeked at). No real decision is this one: every algorithm reports at least a second
/// until its reset.
const UNANSWERED: Decision = Decision {
    penalized: false,
    count_after: 0,
    count_before: 0,
    over: false,
    remaining: 0,
    reset_after_secs: 0,
    expired: 0,
};

/// Probes every peer every 500 ms with an empty call and brings back those that answer again.
///
/// A peer is marked down by probes too, so that no node has to pay a forward's deadline to find
/// out, but only once it has answered at least once and then missed two probes in a row: peers
/// start at different moments, and a probe that ran before a peer was up must not move its keys
/// away (which would split their counters). In divided mode one missed probe is enough, since
/// the live count sets every node's share.
async fn probe_peers(
    members: Arc<ArcSwap<Members>>,
    mode: ClusterMode,
    (changes, returned): (Arc<RingChanges>, tokio::sync::mpsc::Sender<String>),
    clock: Arc<dyn Clock>,
) {
    const MISSES_BEFORE_DOWN: u32 = 2;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    // Per peer address: answered at least once, and consecutive misses.
    let mut seen: std::collections::HashMap<String, (bool, u32)> = Default::default();
    loop {
        tick.tick().await;
        let m = members.load_full();
        let probes = m.clients.iter().enumerate().filter_map(|(i, client)| {
            client
                .as_ref()
                .map(|c| async move { (i, c.apply(Vec::new(), Op::Apply).await.is_ok()) })
        });
        for (i, ok) in futures_util::future::join_all(probes).await {
            let state = seen.entry(m.ring.addr(i).to_owned()).or_default();
            if ok {
                if !state.0 {
                    // Its first answer: whatever runtime limits it holds, this node takes.
                    let _ = returned.try_send(m.ring.addr(i).to_owned());
                }
                *state = (true, 0);
            } else {
                state.1 += 1;
            }
            let mark_down = !ok
                && match mode {
                    ClusterMode::Divided => true,
                    ClusterMode::Forward | ClusterMode::Lease => {
                        state.0 && state.1 >= MISSES_BEFORE_DOWN
                    }
                };
            if !ok && !mark_down {
                continue;
            }
            let was_down = m.down[i].swap(!ok, Ordering::Relaxed);
            if was_down && ok {
                tracing::info!(peer = m.ring.addr(i), "peer answers again");
                // What it changed while cut off, and what it missed it pulls itself.
                let _ = returned.try_send(m.ring.addr(i).to_owned());
                // Its keys come back to it. In lease mode that is a change the holders of those
                // keys must report to (renewal() reports every key once per change), so the
                // returning owner learns what they used before it grants.
                if mode == ClusterMode::Lease {
                    changes.record_return(clock.now());
                }
            } else if !was_down && !ok {
                changes.record(clock.now());
                tracing::warn!(
                    peer = m.ring.addr(i),
                    "peer stopped answering; marking it down"
                );
                m.warn_if_alone();
            }
        }
    }
}

/// Whether this node owns a key, as the ring says now: what a child cluster's parent link asks.
fn owns(members: &Arc<ArcSwap<Members>>) -> lease_parent::Owns {
    let members = members.clone();
    Arc::new(move |key| {
        let m = members.load();
        m.owner(key) == m.me
    })
}

/// The probes of the peers, and with PEERS_DNS the resolver.
fn membership_tasks(
    members: &Arc<ArcSwap<Members>>,
    dialer: Dialer,
    (changes, join, returned): (
        &Arc<RingChanges>,
        &Arc<Joining>,
        tokio::sync::mpsc::Sender<String>,
    ),
    clock: &Arc<dyn Clock>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mode = dialer.settings.mode;
    let mut tasks = vec![tokio::spawn(probe_peers(
        members.clone(),
        mode,
        (changes.clone(), returned),
        clock.clone(),
    ))];
    if let PeerSource::Dns { name, port } = dialer.settings.peers.clone() {
        tasks.push(tokio::spawn(resolve_peers(
            members.clone(),
            name,
            port,
            dialer,
            (changes.clone(), join.clone()),
            clock.clone(),
        )));
    }
    tasks
}

/// PEERS_DNS: re-resolves the name every 5 s and rebuilds the membership when it changes.
async fn resolve_peers(
    members: Arc<ArcSwap<Members>>,
    name: String,
    port: u16,
    dialer: Dialer,
    (changes, join): (Arc<RingChanges>, Arc<Joining>),
    clock: Arc<dyn Clock>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tick.tick().await;
        let Ok(addrs) = tokio::net::lookup_host((name.as_str(), port)).await else {
            tracing::warn!(name = %name, "cannot resolve PEERS_DNS; keeping the current peers");
            continue;
        };
        let addrs: Vec<String> = addrs.map(|a| a.to_string()).collect();
        let current: Vec<String> = members.load().ring.addrs().map(str::to_owned).collect();
        let me = dialer.settings.advertise.clone();
        // The peers route this node's keys to it once their own answers list it too.
        join.resolved(addrs.contains(&me), clock.now());
        let next = Ring::new(addrs.iter().cloned().chain([me]));
        if next.addrs().map(str::to_owned).collect::<Vec<_>>() != current {
            match Members::build(addrs, &dialer) {
                Ok(m) => {
                    tracing::info!(peers = ?m.ring.addrs().collect::<Vec<_>>(), "peers changed");
                    members.store(Arc::new(m));
                    changes.record(clock.now());
                }
                Err(e) => tracing::warn!(error = %e, "cannot use the resolved peers"),
            }
        }
    }
}

impl CounterStore for ClusterStore {
    async fn apply<'a>(
        &'a self,
        now: Timestamp,
        hits: &'a [Hit<'a>],
        out: &'a mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        self.route(now, hits, Op::Apply, out).await
    }

    async fn refund<'a>(
        &'a self,
        now: Timestamp,
        hits: &'a [Hit<'a>],
        out: &'a mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        self.route(now, hits, Op::Refund, out).await
    }

    /// In lease mode a window counts only what its holder admitted (a lease cannot hold a
    /// refused hit), so a fixed window counts refused hits only with `charge_refused: true`,
    /// which its owner counts instead, as the other algorithms' with it are.
    fn counts_refused(&self, quota: &Quota) -> bool {
        match self.mode {
            // Limits that charge refused hits are never leased: their owner counts them
            // (`LeaseTable::route`), as it does every concurrency limit.
            ClusterMode::Lease => quota.charge_refused,
            ClusterMode::Forward | ClusterMode::Divided => quota.charges_refused(),
        }
    }

    async fn reset<'a>(&'a self, now: Timestamp, hits: &'a [Hit<'a>]) -> Result<(), StoreError> {
        self.route(now, hits, Op::Reset, &mut Vec::new()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::limiter::Unit;

    /// An address nobody listens on: a port the system gave, closed again at once.
    fn closed_port() -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    }

    /// A key that both other peers rank above `me`, so that both are tried before it.
    fn key_owned_elsewhere_twice(ring: &Ring, me: usize) -> String {
        (0..)
            .map(|i| format!("d_k_{i}_"))
            .find(|key| {
                let h = key_hash(key);
                let first = ring.owner(h, |_| true);
                first != Some(me) && ring.owner(h, |i| Some(i) != first) != Some(me)
            })
            .unwrap()
    }

    /// Both owners of a key unreachable: the request fails with the backend error it always
    /// had (the same message, so the same status), which now keeps the last peer's error.
    #[tokio::test]
    async fn a_key_whose_owners_all_fail_keeps_the_last_peer_error() {
        let me = "127.0.0.1:1".to_owned();
        let peers = vec![me.clone(), closed_port(), closed_port()];
        let config = ClusterConfig {
            peers: PeerSource::Static(peers.clone()),
            advertise: me.clone(),
            listen: "127.0.0.1:1".parse().unwrap(),
            mode: ClusterMode::Forward,
            timeout: Duration::from_secs(5),
            batch_window: Duration::from_micros(200),
            write_behind: None,
            lease: lease::LeaseTiming::DEFAULT,
            parent: None,
        };
        let clock = Arc::new(ManualClock::new(Timestamp::from_secs(1_000)));
        let memory = Arc::new(MemoryStore::new(1_000));
        let store = ClusterStore::start(memory, &config, None, clock.clone()).unwrap();
        let ring = Ring::new(peers);
        let key = key_owned_elsewhere_twice(&ring, ring.index_of(&me).unwrap());
        let hits = [Hit {
            key: &key,
            quota: Quota::fixed(10, Unit::Hour),
            hits: 1,
        }];
        let error = store
            .apply(clock.now(), &hits, &mut Vec::new())
            .await
            .expect_err("no owner answers");
        assert_eq!(
            error.to_string(),
            "backend error: the owners of some counters did not answer"
        );
        assert!(matches!(error, StoreError::Peer { .. }), "{error:?}");
        let source = std::error::Error::source(&error).expect("a source");
        let peer = source.downcast_ref::<PeerError>().expect("a PeerError");
        assert!(matches!(peer, PeerError::Unreachable { .. }), "{peer:?}");
        assert_eq!(store.stats().failed_forwards.load(Ordering::Relaxed), 2);
    }
}
