//! Buckets split across Sluice nodes (PEERS): each bucket's owner on the ring splits it across
//! every node's Envoys, with the same [`super::bucket`] code it uses for its own streams.
//!
//! - A node keeps its own Envoys' holders of every bucket (their demand, measured from their
//!   reports, their part, their expiry) and, every [`SYNC_INTERVAL`] and at once when an Envoy
//!   starts reporting a bucket, sends each owner the holders of the buckets it owns
//!   ([`RlqsService::sync_once`]). The owner answers each holder's part; the node pushes the
//!   parts that changed on their streams. A new holder gets nothing until that first answer, so
//!   its Envoy keeps its `no_assignment_behavior` for one round trip.
//! - The owner keeps the other nodes' Envoys as holders tagged with their node
//!   ([`RlqsService::answer_sync`]): their demand and expiry as the node reports them, their part
//!   as the owner last split it. A holder its node stops listing is forgotten; one whose node
//!   stops calling is freed when its assignment expires, as a closed stream is.
//! - A holder the owner has not seen (a new owner after a ring change, or a restart) starts from
//!   the part its node says its Envoy holds, and every node lists all its holders at each sync,
//!   so a new owner knows every Envoy within one sync interval. Until then it splits among those
//!   it knows: a bucket can be assigned up to twice its rate for one sync interval, and a lost
//!   owner's own Envoys keep their parts until they expire (one TTL), unknown to the new owner.
//! - A changed part travels to an Envoy on another node within one sync interval; between the
//!   owner lowering one Envoy's part and raising another's, both may briefly hold the old and new
//!   parts (a sync interval at most).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::bucket::Holder;
use super::{Push, Rate, RlqsService, holder_charge, local_holders};
use crate::descriptor::Entry;

/// How often a node sends the owners of the buckets its Envoys report what they hold.
pub(crate) const SYNC_INTERVAL: Duration = Duration::from_millis(500);
/// The most buckets in one sync call (a call is bounded by the peer listener's message size).
pub(crate) const MAX_SYNC_BUCKETS: usize = 512;

/// One bucket in a sync: its key, rate, and the caller's holders of it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SyncBucket {
    pub key: String,
    pub rate: Rate,
    pub holders: Vec<SyncHolder>,
}

/// One of the caller's Envoys holding a part.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SyncHolder {
    pub stream: u64,
    pub id: Vec<Entry>,
    /// Attempted requests per second; `None` before the first sample.
    pub demand: Option<f64>,
    /// The part it holds now, tokens per fill interval.
    pub assigned: u64,
    pub gone: bool,
    /// Its assignment expires this long after the call.
    pub expires_in: Duration,
}

/// Why a sync failed: the peers' own error (the cluster's `PeerError`: a timeout, an unreachable
/// owner, a refusal, a malformed answer), which `rlqs` logs and counts without naming its type.
pub(crate) type SyncError = Box<dyn std::error::Error + Send + Sync>;

/// A call's future.
pub(crate) type SyncFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<Vec<u64>>, SyncError>> + Send + 'a>>;

/// The peers, as the quota service needs them (the cluster implements it).
pub(crate) trait RlqsPeers: Send + Sync {
    /// The owner of the bucket at `key`: `None` when it is this node.
    fn owner(&self, key: &str) -> Option<String>;
    /// Sends `owner` this node's holders of `buckets`; the owner's part for each holder, per
    /// bucket, in order.
    fn sync<'a>(&'a self, owner: &'a str, buckets: Vec<SyncBucket>) -> SyncFuture<'a>;
    /// While this node reaches no majority of its peers (itself included), how many peers it
    /// knows: it then splits only what it may alone ([`super::Rate::alone`]). `None` otherwise.
    fn alone(&self) -> Option<u64>;
}

impl RlqsService {
    /// Syncs every [`SYNC_INTERVAL`], and at once when woken, until `stop` completes. Does
    /// nothing without peers.
    pub(crate) async fn run_sync(self: Arc<Self>, stop: impl Future<Output = ()>) {
        if self.peers.is_none() {
            return;
        }
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = tokio::time::sleep(SYNC_INTERVAL) => {}
                () = self.sync_now.notified() => {}
                () = &mut stop => return,
            }
            self.sync_once().await;
        }
    }

    /// Sends each owner this node's holders of the buckets it owns, and takes its answers.
    pub(crate) async fn sync_once(&self) {
        let Some(peers) = self.peers.clone() else {
            return;
        };
        let now = self.now_us();
        let mut by_owner: HashMap<String, Vec<SyncBucket>> = HashMap::new();
        for b in self.buckets.iter() {
            let Some(owner) = peers.owner(b.key()) else {
                continue;
            };
            let holders: Vec<SyncHolder> = b
                .holders
                .iter()
                .filter(|h| h.node.is_none())
                .map(|h| SyncHolder {
                    stream: h.stream,
                    id: h.id.to_vec(),
                    demand: h.demand,
                    assigned: h.assigned,
                    gone: h.gone,
                    expires_in: Duration::from_micros(h.expires_us.saturating_sub(now)),
                })
                .collect();
            if !holders.is_empty() {
                by_owner.entry(owner).or_default().push(SyncBucket {
                    key: b.key().to_string(),
                    rate: b.rate,
                    holders,
                });
            }
        }
        for (owner, buckets) in by_owner {
            for chunk in buckets.chunks(MAX_SYNC_BUCKETS) {
                match peers.sync(&owner, chunk.to_vec()).await {
                    Ok(parts) => self.take_parts(chunk, &parts),
                    Err(e) => {
                        self.counters.sync_failures.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(owner = %owner, error = %e, "rlqs sync failed; Envoys keep their parts");
                    }
                }
            }
        }
    }

    /// The owner's answer to a sync: each holder's new part; changed (or first) parts are pushed.
    fn take_parts(&self, sent: &[SyncBucket], parts: &[Vec<u64>]) {
        let mut pushes = Vec::new();
        for (b, parts) in sent.iter().zip(parts) {
            let Some(mut bucket) = self.buckets.get_mut(b.key.as_str()) else {
                continue;
            };
            let tokens = bucket.rate.tokens;
            for (h, &part) in b.holders.iter().zip(parts) {
                let Some(at) = bucket.position(None, h.stream, &h.id) else {
                    continue;
                };
                let holder = &mut bucket.holders[at];
                let part = part.min(tokens);
                if !holder.confirmed || holder.assigned != part {
                    holder.assigned = part;
                    holder.confirmed = true;
                    if !holder.gone {
                        pushes.push((holder.stream, holder.id.clone()));
                    }
                }
            }
        }
        for (stream, id) in pushes {
            self.push(stream, id, Push::Current);
        }
    }

    /// The owner's side of a sync from `node`: takes its holders of each bucket (forgetting
    /// those it no longer lists), splits, and answers their parts in order. A bucket this node
    /// cannot hold (SLUICE_RLQS_MAX_BYTES) answers the parts the holders have.
    pub(crate) fn answer_sync(&self, node: &str, buckets: Vec<SyncBucket>) -> Vec<Vec<u64>> {
        let node: Arc<str> = Arc::from(node);
        let now = self.now_us();
        let mut answers = Vec::with_capacity(buckets.len());
        let mut pushes = Vec::new();
        for b in buckets {
            let Some(mut bucket) = self.bucket_mut(&b.key, b.rate) else {
                self.counters.refused.fetch_add(1, Ordering::Relaxed);
                answers.push(b.holders.iter().map(|h| h.assigned).collect());
                continue;
            };
            let listed = |h: &Holder| b.holders.iter().any(|s| h.is(Some(&node), s.stream, &s.id));
            let before = bucket.holders.len();
            let mut freed = 0;
            bucket.holders.retain(|h| {
                let keep = h.node.as_deref() != Some(&*node) || listed(h);
                if !keep {
                    freed += holder_charge(&h.id);
                }
                keep
            });
            debug_assert!(bucket.holders.len() <= before);
            self.release(freed);
            for s in &b.holders {
                let at = match bucket.position(Some(&node), s.stream, &s.id) {
                    Some(at) => at,
                    None => {
                        if !self.charge(holder_charge(&s.id)) {
                            continue;
                        }
                        let id: Arc<[Entry]> = s.id.clone().into();
                        let assigned = s.assigned.min(bucket.rate.tokens);
                        bucket.holders.reserve_exact(1);
                        bucket.holders.push(Holder::remote(
                            node.clone(),
                            s.stream,
                            id,
                            assigned,
                            now,
                        ));
                        bucket.holders.len() - 1
                    }
                };
                let h = &mut bucket.holders[at];
                h.demand = s.demand;
                h.gone = s.gone;
                h.expires_us = now.saturating_add(s.expires_in.as_micros() as u64);
            }
            let changed = self.split(&mut bucket);
            pushes.extend(local_holders(&bucket, changed.into_iter()));
            answers.push(
                b.holders
                    .iter()
                    .map(|s| {
                        bucket
                            .position(Some(&node), s.stream, &s.id)
                            .map_or(0, |at| bucket.holders[at].assigned)
                    })
                    .collect(),
            );
        }
        for (stream, id) in pushes {
            self.push(stream, id, Push::Current);
        }
        answers
    }
}

#[cfg(test)]
mod tests;
