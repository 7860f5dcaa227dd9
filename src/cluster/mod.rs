//! The peer cluster: every counter key has one owner among the Sluice peers, picked by
//! rendezvous hashing ([`ring`]); the owner keeps the counter in its memory store and the
//! other peers forward hits to it ([`peer`]), batched per peer.
//!
//! - **Routing** (`route`): one type per SLUICE_CLUSTER_MODE behind one `Route` trait, each
//!   holding only the state it uses: forward, divided, leased (lease mode: its routing, its
//!   calls and tasks; the lease logic is [`lease`]); and minority, which every mode takes while
//!   this node reaches no majority. [`ClusterStore`] only picks one.
//! - **Membership** (`members`): PEERS (static) or PEERS_DNS (re-resolved every 5 s). A peer whose call
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
mod members;
mod owner;
pub mod peer;
pub mod ring;
pub(crate) mod rlqs_peers;
mod route;
pub(crate) mod runtime_peers;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::clock::{Clock, Timestamp};
use crate::config::ConfigHandle;
use crate::limiter::{Decision, Quota};
use crate::store::{CounterStore, Hit, MemoryStore, StoreError};
use crate::tls::PeerTls;
pub(crate) use config::ParentConfig;
pub use config::{ClusterConfig, ClusterMode, PeerSource, WriteBehind};
use durable::{Durable, RingChanges};
use join::Joining;
use lease::parent_link::Owns;
use lease::parent_link::ParentLink;
use lease::{KeyView, LeaseServer};
use members::{Dialer, Members, membership_tasks};
pub use owner::{OwnerStore, Served};
use peer::{Op, PeerError};
pub use route::node_limit as divided_node_limit;
use route::{Divided, Forward, Leased, Leasing, Minority, Mode, Route};
use runtime_peers::PeerLimits;

/// Peers that answered first or again, waiting for the runtime limits to reconcile with them;
/// past it one is dropped, and the anti-entropy pass finds what it would have brought.
const RETURNED_QUEUE: usize = 1024;

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

/// A counter store spread over the peers; this node's share lives in `owner`.
pub struct ClusterStore {
    local: Arc<MemoryStore>,
    owner: Arc<OwnerStore>,
    changes: Arc<RingChanges>,
    members: Arc<ArcSwap<Members>>,
    /// SLUICE_CLUSTER_MODE's routing, and the one every mode takes without a majority.
    mode: Mode,
    minority: Minority,
    stats: Arc<ClusterStats>,
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
    /// brain: `route::minority`).
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
            matches!(settings.peers, PeerSource::Static(_)) && members.load().ring().len() == 1;
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
        let parent = ParentLink::spawn(settings, server, tls_parent, tools)?.map(|(link, task)| {
            tasks.push(task);
            link
        });
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
        let (mode, minority) = routes(settings, &owner, (&members, &changes), &clock);
        if let Mode::Lease(l) = &mode {
            tasks.extend(l.leasing.spawn());
        }
        Ok(ClusterStore {
            local,
            owner,
            changes,
            members,
            mode,
            minority,
            stats,
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
    pub(crate) fn rlqs_peers(&self, clock: Arc<dyn Clock>) -> Arc<dyn crate::rlqs::RlqsPeers> {
        Arc::new(rlqs_peers::ClusterRlqs {
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
    pub(crate) fn has_majority(&self) -> bool {
        self.members.load().has_quorum()
    }

    /// The peer addresses and whether each is up, for the debug listener.
    pub fn peers(&self) -> Vec<(String, bool)> {
        self.members.load().peers()
    }

    /// Lease mode: the leases this node holds and how it asks for them.
    fn leasing(&self) -> Option<&Arc<Leasing>> {
        match &self.mode {
            Mode::Lease(l) => Some(&l.leasing),
            Mode::Forward(_) | Mode::Divided(_) => None,
        }
    }

    /// Lease mode's counters and table sizes, for `/stats` and `/metrics`: (name, value),
    /// counters first, then the gauges; empty outside lease mode.
    pub(crate) fn lease_stats(&self) -> Vec<(&'static str, u64)> {
        self.leasing().map(|l| l.stats()).unwrap_or_default()
    }

    /// `key`'s leases as this node sees them; `None` outside lease mode.
    pub(crate) fn lease_view(&self, key: &str) -> Option<KeyView> {
        Some(self.leasing()?.view(key))
    }

    /// Applies, refunds or resets `hits` where their counters live, as SLUICE_CLUSTER_MODE
    /// says; alone, within each limit's safe capacity, while this node reaches no majority.
    async fn route(
        &self,
        now: Timestamp,
        hits: &[Hit<'_>],
        op: Op,
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        let members = self.members.load_full();
        if !members.has_quorum() {
            return self.minority.route(&members, now, hits, op, out).await;
        }
        self.mode.route(&members, now, hits, op, out).await
    }
}

/// Whether this node owns a key, as the ring says now: what a child cluster's parent link asks.
fn owns(members: &Arc<ArcSwap<Members>>) -> Owns {
    let members = members.clone();
    Arc::new(move |key| {
        let m = members.load();
        m.owner(key) == m.me
    })
}

/// SLUICE_CLUSTER_MODE's routing over `owner`, and the minority route every mode shares.
fn routes(
    settings: &ClusterConfig,
    owner: &Arc<OwnerStore>,
    (members, changes): (&Arc<ArcSwap<Members>>, &Arc<RingChanges>),
    clock: &Arc<dyn Clock>,
) -> (Mode, Minority) {
    let leasing = (settings.mode == ClusterMode::Lease).then(|| {
        Arc::new(Leasing::new(
            settings,
            owner.clone(),
            members.clone(),
            changes.clone(),
            clock.clone(),
        ))
    });
    let minority = Minority {
        owner: owner.clone(),
        lease: leasing.clone(),
    };
    let forward = Forward {
        owner: owner.clone(),
        changes: changes.clone(),
        minority: minority.clone(),
    };
    let mode = match (settings.mode, leasing) {
        (ClusterMode::Lease, Some(leasing)) => Mode::Lease(Leased { leasing, forward }),
        (ClusterMode::Divided, _) => Mode::Divided(Divided {
            local: owner.local().clone(),
            forward,
        }),
        _ => Mode::Forward(forward),
    };
    (mode, minority)
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
            Mode::Lease(_) => quota.charge_refused,
            Mode::Forward(_) | Mode::Divided(_) => quota.charges_refused(),
        }
    }

    async fn reset<'a>(&'a self, now: Timestamp, hits: &'a [Hit<'a>]) -> Result<(), StoreError> {
        self.route(now, hits, Op::Reset, &mut Vec::new()).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::ring::{Ring, key_hash};
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
