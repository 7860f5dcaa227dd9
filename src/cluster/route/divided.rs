//! Divided mode (SLUICE_CLUSTER_MODE=divided, Cortex's global limiter): no forwarding; each
//! node enforces `ceil(limit / live peers)` locally. A concurrency limit is forwarded to its
//! owner in every mode: a request's start and its end's refund must meet.

use std::sync::Arc;

use super::{Forward, Route};
use crate::clock::Timestamp;
use crate::cluster::members::Members;
use crate::cluster::peer::Op;
use crate::limiter::Decision;
use crate::store::{Hit, MemoryStore, StoreError};

/// Divided mode's state: this node's memory store, and the forward route for concurrency
/// limits.
pub(in crate::cluster) struct Divided {
    pub(in crate::cluster) local: Arc<MemoryStore>,
    pub(in crate::cluster) forward: Forward,
}

impl Route for Divided {
    async fn route(
        &self,
        members: &Members,
        now: Timestamp,
        hits: &[Hit<'_>],
        op: Op,
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        if hits.iter().any(is_slots) {
            self.with_slots(members, now, hits, op, out).await
        } else {
            self.divide(members, now, hits, op, out).await
        }
    }
}

impl Divided {
    /// Divided mode with concurrency limits among the hits: those go to their keys' owners (a
    /// request's start and its end's refund may reach different nodes, and must meet), the
    /// others are divided; the decisions are put back in the hits' order.
    async fn with_slots(
        &self,
        members: &Members,
        now: Timestamp,
        hits: &[Hit<'_>],
        op: Op,
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        let (slots, shares): (Vec<Hit<'_>>, Vec<Hit<'_>>) = hits.iter().partition(|h| is_slots(h));
        let (mut owned, mut divided) = (Vec::new(), Vec::new());
        self.forward
            .route(members, now, &slots, op, &mut owned)
            .await?;
        self.divide(members, now, &shares, op, &mut divided).await?;
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

    /// Each node enforces its share of the limit locally.
    async fn divide(
        &self,
        members: &Members,
        now: Timestamp,
        hits: &[Hit<'_>],
        op: Op,
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        let live = members.live();
        let shared: Vec<Hit<'_>> = hits
            .iter()
            .map(|h| {
                let mut q = h.quota;
                q.requests_per_unit = node_limit(q.requests_per_unit, live);
                Hit { quota: q, ..*h }
            })
            .collect();
        op.run(self.local.as_ref(), now, &shared, out).await
    }
}

/// The part of `limit` each node enforces in divided mode with `live` nodes up (itself
/// included): `ceil(limit / live)`, so the nodes together admit at least the limit, and at most
/// `live - 1` more. The simulator (`bench/programs/src/bin/cluster_sim`) decides by it too.
pub fn node_limit(limit: u32, live: usize) -> u32 {
    let live = u32::try_from(live).unwrap_or(u32::MAX).max(1);
    limit.div_ceil(live)
}

/// Whether a hit is a concurrency limit's, whose slots live with the key's owner in every mode.
fn is_slots(hit: &Hit<'_>) -> bool {
    hit.quota.algorithm == crate::limiter::Algorithm::Concurrency
}
