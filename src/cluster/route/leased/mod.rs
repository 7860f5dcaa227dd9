//! Lease mode's routing: each hit decided from this node's lease on its key, by an acquire
//! from the key's owner when it does not fit (or the key is new here), or forwarded when a
//! lease table is full ([`Leasing`] makes the calls; the lease logic is
//! `cluster::lease::client`).

mod driver;

use std::sync::Arc;

pub(in crate::cluster) use driver::Leasing;

use super::{Forward, Route};
use crate::clock::Timestamp;
use crate::cluster::lease::Route as Local;
use crate::cluster::members::Members;
use crate::cluster::peer::Op;
use crate::limiter::Decision;
use crate::store::{Hit, StoreError};

/// Lease mode's state: the leases this node holds and how it asks for them, and the forward
/// route for the hits no lease decides.
pub(in crate::cluster) struct Leased {
    pub(in crate::cluster) leasing: Arc<Leasing>,
    pub(in crate::cluster) forward: Forward,
}

impl Route for Leased {
    /// Lease mode: each hit decided from this node's lease on its key, by an acquire from the
    /// key's owner when it does not fit (or the key is new here), or forwarded when a lease
    /// table is full. Refunds go back to the lease (or follow the forwarded hit).
    async fn route(
        &self,
        members: &Members,
        now: Timestamp,
        hits: &[Hit<'_>],
        op: Op,
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        let leasing = &self.leasing;
        let client = &leasing.client;
        let now_us = now.micros();
        if op == Op::Reset {
            // The owner's counter; leases already granted run out within a lease duration.
            return self.forward.route(members, now, hits, op, out).await;
        }
        let mut decisions: Vec<Option<Decision>> = vec![None; hits.len()];
        if op == Op::Refund {
            let mut forward = Vec::new();
            for (i, h) in hits.iter().enumerate() {
                match client.refund(h.key, now_us, h.hits) {
                    Some(d) => decisions[i] = Some(d),
                    None => forward.push(i),
                }
            }
            self.forward_rest(members, now, hits, op, &forward, &mut decisions)
                .await?;
            out.extend(decisions.into_iter().flatten());
            return Ok(());
        }
        let (mut acquires, mut waits, mut forward) = (Vec::new(), Vec::new(), Vec::new());
        for (i, h) in hits.iter().enumerate() {
            let terms = || leasing.terms(members, h.key);
            match client.route(h.key, h.quota, now_us, h.hits, || members.live(), terms) {
                Local::Decided(d) => decisions[i] = Some(d),
                Local::Acquire(slot, ask) => acquires.push((i, slot, ask)),
                Local::Wait(slot) => waits.push((i, slot)),
                Local::Forward => forward.push(i),
            }
        }
        if !acquires.is_empty() {
            leasing
                .acquire(members, hits, acquires, &mut decisions, &mut forward)
                .await?;
        }
        for (i, slot) in waits {
            leasing.wait_for(&slot).await;
            decisions[i] = Some(slot.decide_after(leasing.clock.now().micros(), hits[i].hits));
        }
        self.forward_rest(members, now, hits, op, &forward, &mut decisions)
            .await?;
        out.extend(decisions.into_iter().flatten());
        Ok(())
    }
}

impl Leased {
    /// The hits at `forward` sent to their owners as in forward mode, their decisions put in
    /// their places.
    async fn forward_rest(
        &self,
        members: &Members,
        now: Timestamp,
        hits: &[Hit<'_>],
        op: Op,
        forward: &[usize],
        decisions: &mut [Option<Decision>],
    ) -> Result<(), StoreError> {
        if forward.is_empty() {
            return Ok(());
        }
        let mine: Vec<Hit<'_>> = forward.iter().map(|&i| hits[i]).collect();
        let mut answered = Vec::with_capacity(mine.len());
        self.forward
            .route(members, now, &mine, op, &mut answered)
            .await?;
        for (&i, d) in forward.iter().zip(answered) {
            decisions[i] = Some(d);
        }
        Ok(())
    }
}
