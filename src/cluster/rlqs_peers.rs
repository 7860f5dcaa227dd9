//! The peers as the Rate Limit Quota Service sees them ([`crate::rlqs::RlqsPeers`]): each
//! bucket's owner on the same ring as the counters, and the `Quota` call that carries a node's
//! Envoys of a bucket to its owner: its wire form (`bucket_to_wire`, `buckets_from_wire`) and,
//! on the owner, the quota service's answer ([`RlqsOwner`]).

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use super::durable::RingChanges;
use super::members::Members;
use super::peer::{RlqsOwner, wire};
use crate::clock::Clock;
use crate::descriptor::Entry;
use crate::rlqs::remote::{MAX_SYNC_BUCKETS, SyncFuture};
use crate::rlqs::{Rate, RlqsPeers, RlqsService, SyncBucket, SyncHolder};

pub(super) struct ClusterRlqs {
    pub(super) members: Arc<ArcSwap<Members>>,
    pub(super) changes: Arc<RingChanges>,
    pub(super) clock: Arc<dyn Clock>,
}

impl RlqsPeers for ClusterRlqs {
    fn owner(&self, key: &str) -> Option<String> {
        let m = self.members.load();
        let owner = m.owner(key);
        (owner != m.me).then(|| m.ring().addr(owner).to_owned())
    }

    fn alone(&self) -> Option<u64> {
        let m = self.members.load();
        (!m.has_quorum()).then(|| u64::try_from(m.ring().len()).unwrap_or(u64::MAX))
    }

    fn sync<'a>(&'a self, owner: &'a str, buckets: Vec<SyncBucket>) -> SyncFuture<'a> {
        Box::pin(async move {
            let members = self.members.load_full();
            let index = members
                .ring()
                .index_of(owner)
                .ok_or_else(|| format!("{owner} is no longer a peer"))?;
            let client = members
                .client(index)
                .ok_or_else(|| format!("{owner} is this node"))?;
            let buckets = buckets.into_iter().map(bucket_to_wire).collect();
            let me = members.ring().addr(members.me).to_owned();
            let result = client.quota(&me, buckets).await;
            if let Err(e) = &result {
                members.failed(index, e, &self.changes, self.clock.now());
            }
            result.map_err(Into::into)
        })
    }
}

/// The owner's side of the Quota call: the buckets as the quota service takes them, and its
/// parts for each.
impl RlqsOwner for RlqsService {
    fn answer(
        &self,
        node: &str,
        buckets: Vec<wire::QuotaBucket>,
    ) -> Result<Vec<wire::QuotaParts>, tonic::Status> {
        let buckets = buckets_from_wire(buckets)?;
        let parts = self.answer_sync(node, buckets);
        Ok(parts
            .into_iter()
            .map(|assigned| wire::QuotaParts { assigned })
            .collect())
    }
}

/// The most holders of one bucket a node may list in a Quota call (its Envoys of the bucket).
const MAX_SYNC_HOLDERS: usize = 4096;

/// The wire form of one bucket of a sync.
fn bucket_to_wire(b: SyncBucket) -> wire::QuotaBucket {
    wire::QuotaBucket {
        key: b.key,
        tokens: b.rate.tokens,
        fill_secs: b.rate.fill_secs,
        burst: b.rate.burst,
        safe_tokens: b.rate.safe_tokens,
        holders: b
            .holders
            .into_iter()
            .map(|h| wire::QuotaHolder {
                stream: h.stream,
                id: h
                    .id
                    .into_iter()
                    .map(|e| wire::QuotaEntry {
                        key: e.key,
                        value: e.value,
                    })
                    .collect(),
                has_demand: h.demand.is_some(),
                demand_milli: h
                    .demand
                    .map_or(0, |d| (d * 1000.0).min(u64::MAX as f64) as u64),
                assigned: h.assigned,
                gone: h.gone,
                expires_in_us: u64::try_from(h.expires_in.as_micros()).unwrap_or(u64::MAX),
            })
            .collect(),
    }
}

/// A sync's buckets as the owner takes them; a call past the bounds, or a rate that is not one,
/// is refused whole (INVALID_ARGUMENT).
fn buckets_from_wire(buckets: Vec<wire::QuotaBucket>) -> Result<Vec<SyncBucket>, tonic::Status> {
    if buckets.len() > MAX_SYNC_BUCKETS {
        return Err(tonic::Status::invalid_argument(format!(
            "a quota call carries at most {MAX_SYNC_BUCKETS} buckets, not {}",
            buckets.len()
        )));
    }
    buckets.into_iter().map(bucket_from_wire).collect()
}

fn bucket_from_wire(b: wire::QuotaBucket) -> Result<SyncBucket, tonic::Status> {
    if b.tokens == 0 || b.fill_secs == 0 {
        return Err(tonic::Status::invalid_argument(format!(
            "quota bucket {:?}: a rate of {} tokens per {} s",
            b.key, b.tokens, b.fill_secs
        )));
    }
    if b.holders.len() > MAX_SYNC_HOLDERS {
        return Err(tonic::Status::invalid_argument(format!(
            "quota bucket {:?}: at most {MAX_SYNC_HOLDERS} holders per call, not {}",
            b.key,
            b.holders.len()
        )));
    }
    Ok(SyncBucket {
        key: b.key,
        rate: Rate {
            tokens: b.tokens,
            fill_secs: b.fill_secs,
            burst: b.burst,
            safe_tokens: b.safe_tokens,
        },
        holders: b
            .holders
            .into_iter()
            .map(|h| SyncHolder {
                stream: h.stream,
                id: h
                    .id
                    .into_iter()
                    .map(|e| Entry {
                        key: e.key,
                        value: e.value,
                    })
                    .collect(),
                demand: h.has_demand.then(|| h.demand_milli as f64 / 1000.0),
                assigned: h.assigned,
                gone: h.gone,
                expires_in: Duration::from_micros(h.expires_in_us),
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sync_crosses_the_wire_unchanged() {
        let bucket = SyncBucket {
            key: "rlqs_tenant_acme_".into(),
            rate: Rate {
                tokens: 1_000,
                fill_secs: 10,
                burst: 100,
                safe_tokens: Some(300),
            },
            holders: vec![SyncHolder {
                stream: 7,
                id: vec![Entry::new("tenant", "acme")],
                demand: Some(42.5),
                assigned: 420,
                gone: true,
                expires_in: Duration::from_millis(1_500),
            }],
        };
        let back = buckets_from_wire(vec![bucket_to_wire(bucket.clone())]).unwrap();
        assert_eq!(back, vec![bucket]);
    }

    #[test]
    fn a_sync_past_its_bounds_or_with_no_rate_is_refused() {
        let empty = wire::QuotaBucket {
            key: "k".into(),
            tokens: 1,
            fill_secs: 1,
            ..Default::default()
        };
        let many = vec![empty.clone(); MAX_SYNC_BUCKETS + 1];
        assert_eq!(
            buckets_from_wire(many).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        let no_rate = wire::QuotaBucket { tokens: 0, ..empty };
        assert!(buckets_from_wire(vec![no_rate]).is_err());
    }
}
