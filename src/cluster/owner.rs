//! This node's counters as an owner ([`OwnerStore`]): the memory store behind the write-behind's
//! take-over loads and marks, the relays of a joining node to the keys' previous owners
//! ([`super::join`]), and lease mode's server side (answers, free-share permits and recalls).
//! This node's own hits and the hits peers forward to it both go through here.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use arc_swap::ArcSwap;

use super::ClusterStats;
use super::durable::{Durable, RingChanges};
use super::join::{Joining, Relay};
use super::lease::parent_link::ParentLink;
use super::lease::{self, LeaseServer};
use super::members::Members;
use super::peer::{Malformed, Op, PeerDecision, PeerError, PeerHit};
use crate::clock::Timestamp;
use crate::limiter::{CounterKind, Decision, Quota};
use crate::store::{CounterStore, Hit, MemoryStore, StoreError};

/// This node's counters as an owner: the memory store, plus, with SLUICE_PEER_WRITE_BEHIND,
/// the take-over loads before hits are applied and the write-behind marks after. Both this
/// node's own hits and the hits peers forward to it go through here.
pub struct OwnerStore {
    pub(super) local: Arc<MemoryStore>,
    pub(super) durable: Option<Arc<Durable>>,
    pub(super) members: Arc<ArcSwap<Members>>,
    /// Lease mode: this node's lease server for the keys it owns.
    pub(super) leases: Option<Arc<LeaseServer>>,
    /// SLUICE_LEASE_FREE_SHARE_PERCENT in parts per million: what the permits this node gives
    /// as an owner share among the ring's nodes.
    pub(super) free_share_ppm: u64,
    /// SLUICE_LEASE_PARENT: where the lease server's capacity comes from.
    pub(super) parent: Option<Arc<ParentLink>>,
    pub(super) changes: Arc<RingChanges>,
    /// When this node's join settled, for the keys it relays to their previous owner.
    pub(super) join: Arc<Joining>,
    /// A relay's deadline: half the peers' (a relay often runs inside a call a peer forwarded,
    /// which must not miss its own deadline, as for a take-over load).
    pub(super) relay_timeout: Duration,
    pub(super) stats: Arc<ClusterStats>,
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

    pub fn parent(&self) -> Option<&Arc<ParentLink>> {
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
        let ring = u64::try_from(self.members.load().ring().len().max(1)).unwrap_or(u64::MAX);
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
    /// whose count its previous owner keeps, there ([`super::join`]). `relay[i]` says how hit `i`
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

/// Stands in for the decision of a hit done without one (a reset; a refund on an older owner,
/// to be peeked at). No real decision is this one: every algorithm reports at least a second
/// until its reset.
pub(super) const UNANSWERED: Decision = Decision {
    penalized: false,
    count_after: 0,
    count_before: 0,
    over: false,
    remaining: 0,
    reset_after_secs: 0,
    expired: 0,
};
