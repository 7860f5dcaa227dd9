//! Forward mode: each hit applied on its key's owner (this node's [`OwnerStore`], or a forward
//! to the peer), retried once on the next owners for the hits whose owner failed. The other
//! modes forward what they do not decide themselves through here.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Minority, Route};
use crate::clock::Timestamp;
use crate::cluster::durable::RingChanges;
use crate::cluster::members::Members;
use crate::cluster::owner::{OwnerStore, UNANSWERED};
use crate::cluster::peer::{Op, PeerError, PeerHit};
use crate::limiter::Decision;
use crate::store::{Cause, Hit, StoreError};

/// Forward mode's state: this node's owner store (and its counters), the ring changes a failed
/// peer is recorded in, and the minority route a node left without a majority decides by.
#[derive(Clone)]
pub(in crate::cluster) struct Forward {
    pub(in crate::cluster) owner: Arc<OwnerStore>,
    pub(in crate::cluster) changes: Arc<RingChanges>,
    pub(in crate::cluster) minority: Minority,
}

impl Route for Forward {
    async fn route(
        &self,
        members: &Members,
        now: Timestamp,
        hits: &[Hit<'_>],
        op: Op,
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        self.forward(members, now, hits, op, out).await
    }
}

impl Forward {
    /// Each hit applied on its key's owner.
    async fn forward(
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
        self.minority
            .route(members, now, &alone, op, &mut decided)
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
        Box::pin(self.forward(members, now, &peeks, Op::Apply, &mut answered)).await?;
        for (&i, d) in unanswered.iter().zip(answered) {
            decisions[i] = Some(d);
        }
        Ok(())
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
            self.owner
                .stats
                .local_hits
                .fetch_add(mine.len() as u64, Ordering::Relaxed);
            let mut out = Vec::new();
            let r = op.run(self.owner.as_ref(), now, &mine, &mut out).await;
            return r.map(|()| out).map_err(OwnerFailed::Local);
        }
        let Some(client) = members.client(owner) else {
            return Err(OwnerFailed::Peer(PeerError::NoClient(
                "no client for the peer",
            )));
        };
        let wire = mine.iter().map(PeerHit::from_hit).collect();
        self.owner
            .stats
            .forwarded_hits
            .fetch_add(mine.len() as u64, Ordering::Relaxed);
        match client.apply(wire, op).await {
            Ok(d) => Ok(d.into_iter().map(Decision::from).collect()),
            Err(e) => {
                self.owner
                    .stats
                    .failed_forwards
                    .fetch_add(1, Ordering::Relaxed);
                members.failed(owner, &e, &self.changes, now);
                Err(OwnerFailed::Peer(e))
            }
        }
    }
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
