//! The peers as the Rate Limit Quota Service sees them ([`crate::quota::QuotaPeers`]): each
//! bucket's owner on the same ring as the counters, and the `Quota` call (its wire form is in
//! [`super::peer`]) that carries a node's Envoys of a bucket to its owner.

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::Members;
use super::durable::RingChanges;
use super::peer::bucket_to_wire;
use crate::clock::Clock;
use crate::quota::remote::SyncFuture;
use crate::quota::{QuotaPeers, SyncBucket};

pub(super) struct ClusterQuota {
    pub(super) members: Arc<ArcSwap<Members>>,
    pub(super) changes: Arc<RingChanges>,
    pub(super) clock: Arc<dyn Clock>,
}

impl QuotaPeers for ClusterQuota {
    fn owner(&self, key: &str) -> Option<String> {
        let m = self.members.load();
        let owner = m.owner(key);
        (owner != m.me).then(|| m.ring.addr(owner).to_owned())
    }

    fn alone(&self) -> Option<u64> {
        let m = self.members.load();
        (!m.has_quorum()).then(|| u64::try_from(m.ring.len()).unwrap_or(u64::MAX))
    }

    fn sync<'a>(&'a self, owner: &'a str, buckets: Vec<SyncBucket>) -> SyncFuture<'a> {
        Box::pin(async move {
            let members = self.members.load_full();
            let index = members
                .ring
                .index_of(owner)
                .ok_or_else(|| format!("{owner} is no longer a peer"))?;
            let client = members.clients[index]
                .as_ref()
                .ok_or_else(|| format!("{owner} is this node"))?;
            let wire = buckets.into_iter().map(bucket_to_wire).collect();
            let me = members.ring.addr(members.me).to_owned();
            let result = client.quota(&me, wire).await;
            if let Err(e) = &result {
                members.failed(index, e, &self.changes, self.clock.now());
            }
            result
        })
    }
}
