//! No split brain: what a node decides while it cannot reach a majority of the peers it knows,
//! itself included (Doorman's safe capacity). The majority side takes over the keys of every
//! node it lost, so a node on the small side must not serve them as an owner or a stand-in,
//! nor forward to other nodes of its side. It decides every hit alone:
//!
//! - lease mode: from the lease it holds on the key, with no renewal and no acquire; once that
//!   is spent (or expired, or there is none) from the limit's safe capacity, less what it used
//!   of its window's allowance; what it admits so is reported with its use once it reaches
//!   the owner again;
//! - forward and divided modes: on its own memory store against the safe capacity.
//!
//! The safe capacity is the limit's `safe_capacity`, by default the limit over the number of
//! peers. So a window admits at most the limit (the majority's) plus each cut-off node's safe
//! capacity (docs/cluster.md, "Partitions").

use std::num::NonZeroU32;
use std::sync::Arc;

use super::{Leasing, Route};
use crate::clock::Timestamp;
use crate::cluster::members::Members;
use crate::cluster::owner::OwnerStore;
use crate::cluster::peer::Op;
use crate::limiter::{Decision, Quota};
use crate::store::{Hit, StoreError};

/// What a node without a majority decides with: its owner store's memory store and counters
/// (never the owner store itself, whose take-over loads and relays reach Redis and other
/// nodes), and in lease mode the leases it holds.
#[derive(Clone)]
pub(in crate::cluster) struct Minority {
    pub(in crate::cluster) owner: Arc<OwnerStore>,
    pub(in crate::cluster) lease: Option<Arc<Leasing>>,
}

impl Route for Minority {
    /// Applies, refunds or resets `hits` on this node alone, as a node without a majority.
    async fn route(
        &self,
        members: &Members,
        now: Timestamp,
        hits: &[Hit<'_>],
        op: Op,
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        let peers = members.ring().len();
        let now_us = now.micros();
        if op == Op::Apply {
            self.owner
                .stats
                .alone_hits
                .fetch_add(hits.len() as u64, std::sync::atomic::Ordering::Relaxed);
        }
        let mut held: Vec<Option<Decision>> = vec![None; hits.len()];
        let mut alone: Vec<Hit<'_>> = Vec::with_capacity(hits.len());
        for (i, h) in hits.iter().enumerate() {
            let lease = self.lease.as_ref().map(|l| &l.client);
            let used = match (lease, op) {
                (Some(client), Op::Apply) => {
                    match client.admit_held(h.key, h.quota, now_us, h.hits) {
                        Some(Ok(d)) => {
                            held[i] = Some(d);
                            continue;
                        }
                        Some(Err(used)) => used,
                        None => 0,
                    }
                }
                (Some(client), Op::Refund) => {
                    if let Some(d) = client.refund(h.key, now_us, h.hits) {
                        held[i] = Some(d);
                        continue;
                    }
                    0
                }
                _ => 0,
            };
            alone.push(Hit {
                quota: safe_quota(&h.quota, peers, used),
                ..*h
            });
        }
        let mut decided = Vec::with_capacity(alone.len());
        op.run(self.owner.local().as_ref(), now, &alone, &mut decided)
            .await?;
        if op == Op::Reset {
            return Ok(());
        }
        if let (Some(lease), Op::Apply) = (&self.lease, op) {
            for (h, d) in alone.iter().zip(&decided) {
                if !d.over {
                    lease.client.admitted_alone(h.key, now_us, h.hits);
                }
            }
        }
        let mut decided = decided.into_iter();
        for d in held {
            out.extend(d.or_else(|| decided.next()));
        }
        Ok(())
    }
}

/// What one node may admit of `quota` alone, among `peers` nodes: its safe capacity (or the
/// limit over the peers), less `used` of a lease's allowance in the window; a bucket's burst
/// scaled as its rate is.
fn safe_quota(quota: &Quota, peers: usize, used: u64) -> Quota {
    let limit = quota.requests_per_unit;
    let safe = quota.safe_capacity.map_or_else(
        || limit / u32::try_from(peers).unwrap_or(u32::MAX).max(1),
        NonZeroU32::get,
    );
    let left = u64::from(safe).saturating_sub(used);
    let left = u32::try_from(left).unwrap_or(u32::MAX);
    let burst = quota.burst.and_then(|b| {
        let scaled = u64::from(b.get()) * u64::from(safe) / u64::from(limit.max(1));
        NonZeroU32::new(u32::try_from(scaled).unwrap_or(u32::MAX).max(1))
    });
    Quota {
        requests_per_unit: left,
        burst,
        ..*quota
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Unit;

    #[test]
    fn the_safe_capacity_is_the_setting_or_the_limit_over_the_peers_less_what_was_used() {
        let q = Quota::fixed(600, Unit::Minute);
        assert_eq!(safe_quota(&q, 3, 0).requests_per_unit, 200);
        assert_eq!(safe_quota(&q, 3, 150).requests_per_unit, 50);
        assert_eq!(safe_quota(&q, 3, 250).requests_per_unit, 0);
        let set = Quota {
            safe_capacity: NonZeroU32::new(50),
            ..q
        };
        assert_eq!(safe_quota(&set, 3, 0).requests_per_unit, 50);
        assert_eq!(safe_quota(&set, 3, 0).safe_capacity, set.safe_capacity);
        let bucket = Quota {
            burst: NonZeroU32::new(60),
            ..q
        };
        assert_eq!(safe_quota(&bucket, 3, 0).burst, NonZeroU32::new(20));
        assert_eq!(safe_quota(&q, 1000, 0).requests_per_unit, 0);
    }
}
