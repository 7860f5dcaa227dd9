//! Membership: the peers as currently known ([`Members`]: the ring, a client per remote peer,
//! who is down), the probes that mark peers down and bring them back, and with PEERS_DNS the
//! resolver that rebuilds the membership when the name's addresses change. The ring, clients
//! and down marks are a [`PeerRing`], the core the parent link's membership shares.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use super::durable::RingChanges;
use super::join::Joining;
use super::peer::{Op, PeerClient, PeerError};
use super::ring::{PeerRing, Ring, UNTIL_CLEARED, UP, key_hash};
use super::{ClusterConfig, ClusterMode, ClusterStats, PeerSource, StartError};
use crate::clock::{Clock, Timestamp};
use crate::tls::PeerTls;

/// When [`Members`] reads its marks: any time will do, since they are [`UP`] or
/// [`UNTIL_CLEARED`], never a time.
const ANY_TIME: u64 = 0;

/// The peers as currently known: the ring, a client per remote peer, and who is down.
///
/// A peer is marked down [`UNTIL_CLEARED`] by a failed call or missed probes, and only an
/// answered probe clears it. This node is never marked: only calls and probes mark, and this
/// node neither calls nor probes itself (it has no client).
pub(super) struct Members {
    /// The ring, a client per peer (`None` for this node), and the down marks.
    peers: PeerRing<Option<PeerClient>>,
    /// Index of this node in the ring.
    pub(super) me: usize,
    /// A second client per remote peer, for a joining node's relays ([`super::join`]): its own
    /// connection and batching queue, so relays never wait behind forwards, which may
    /// themselves wait on relays at their owner.
    pub(super) relay_clients: Vec<Option<PeerClient>>,
}

/// What a client for each remote peer is made from, whenever the peers change.
#[derive(Clone)]
pub(super) struct Dialer {
    /// This node's address among the peers, the deadline and the batch window.
    pub(super) settings: ClusterConfig,
    /// SLUICE_PEER_TLS.
    pub(super) tls: Option<PeerTls>,
    pub(super) stats: Arc<ClusterStats>,
}

impl Members {
    pub(super) fn build(addrs: Vec<String>, dialer: &Dialer) -> Result<Self, StartError> {
        let me = &dialer.settings.advertise;
        let ring = Ring::new(addrs.into_iter().chain([me.clone()]));
        let me_index = ring
            .index_of(me)
            .ok_or_else(|| StartError::NotAPeer(me.clone()))?;
        let clients = Self::dial(&ring, me_index, dialer)?;
        let relay_clients = Self::dial(&ring, me_index, dialer)?;
        Ok(Members {
            peers: PeerRing::new(ring, clients),
            me: me_index,
            relay_clients,
        })
    }

    pub(super) fn ring(&self) -> &Ring {
        self.peers.ring()
    }

    /// Peer `i`'s client; `None` for this node.
    pub(super) fn client(&self, i: usize) -> Option<&PeerClient> {
        self.peers.client(i).as_ref()
    }

    /// Each remote peer's index and client.
    pub(super) fn clients(&self) -> impl Iterator<Item = (usize, &PeerClient)> {
        self.peers
            .clients()
            .filter_map(|(i, c)| c.as_ref().map(|c| (i, c)))
    }

    /// Whether peer `i` is believed up (this node always is).
    pub(super) fn up(&self, i: usize) -> bool {
        self.peers.up(i, ANY_TIME)
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

    /// The key's owner among the peers believed up (this node among them).
    pub(super) fn owner(&self, key: &str) -> usize {
        self.peers.owner(key, ANY_TIME).unwrap_or(self.me)
    }

    /// The key's owner among the peers believed up other than this node: where its counter was
    /// before this node joined ([`super::join`]).
    pub(super) fn previous_owner(&self, key: &str) -> Option<usize> {
        self.ring()
            .owner(key_hash(key), |i| i != self.me && self.up(i))
    }

    /// Whether the key's owner among all peers, up or not, is another node.
    pub(super) fn owned_elsewhere(&self, key: &str) -> bool {
        self.ring().owner(key_hash(key), |_| true) != Some(self.me)
    }

    /// Marks the peer `owner` down after a failed call (`error`), recording the ring change;
    /// one log line when it goes down, not one per failed call.
    pub(super) fn failed(
        &self,
        owner: usize,
        error: &PeerError,
        changes: &RingChanges,
        now: Timestamp,
    ) {
        debug_assert_ne!(owner, self.me, "this node is never marked down");
        if self.peers.mark(owner, UNTIL_CLEARED) == UP {
            tracing::warn!(peer = self.ring().addr(owner), error = %error, "peer failed; marking it down");
            changes.record(now);
            self.warn_if_alone();
        }
    }

    /// One log line when a peer marked down leaves this node without a majority.
    pub(super) fn warn_if_alone(&self) {
        if !self.has_quorum() {
            tracing::warn!(
                live = self.live(),
                peers = self.ring().len(),
                "this node reaches no majority of its peers: it decides alone, within each \
                 limit's safe capacity, until they answer again"
            );
        }
    }

    /// Whether this node reaches a majority of the peers it knows, itself included. Without
    /// one it may be on the small side of a partition, whose other side goes on with the keys:
    /// it decides alone, within each limit's safe capacity (`route::minority`).
    pub(super) fn has_quorum(&self) -> bool {
        self.live() * 2 > self.ring().len()
    }

    pub(super) fn live(&self) -> usize {
        (0..self.ring().len()).filter(|&i| self.up(i)).count()
    }

    /// The peer addresses and whether each is up, for the debug listener.
    pub(super) fn peers(&self) -> Vec<(String, bool)> {
        self.ring()
            .addrs()
            .enumerate()
            .map(|(i, a)| (a.to_owned(), self.up(i)))
            .collect()
    }
}

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
        let probes = m
            .clients()
            .map(|(i, c)| async move { (i, c.apply(Vec::new(), Op::Apply).await.is_ok()) });
        for (i, ok) in futures_util::future::join_all(probes).await {
            let state = seen.entry(m.ring().addr(i).to_owned()).or_default();
            if ok {
                if !state.0 {
                    // Its first answer: whatever runtime limits it holds, this node takes.
                    let _ = returned.try_send(m.ring().addr(i).to_owned());
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
            let was_down = m.peers.mark(i, if ok { UP } else { UNTIL_CLEARED }) != UP;
            if was_down && ok {
                tracing::info!(peer = m.ring().addr(i), "peer answers again");
                // What it changed while cut off, and what it missed it pulls itself.
                let _ = returned.try_send(m.ring().addr(i).to_owned());
                // Its keys come back to it. In lease mode that is a change the holders of those
                // keys must report to (renewal() reports every key once per change), so the
                // returning owner learns what they used before it grants.
                if mode == ClusterMode::Lease {
                    changes.record_return(clock.now());
                }
            } else if !was_down && !ok {
                changes.record(clock.now());
                tracing::warn!(
                    peer = m.ring().addr(i),
                    "peer stopped answering; marking it down"
                );
                m.warn_if_alone();
            }
        }
    }
}

/// The probes of the peers, and with PEERS_DNS the resolver.
pub(super) fn membership_tasks(
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
        let current: Vec<String> = members.load().ring().addrs().map(str::to_owned).collect();
        let me = dialer.settings.advertise.clone();
        // The peers route this node's keys to it once their own answers list it too.
        join.resolved(addrs.contains(&me), clock.now());
        let next = Ring::new(addrs.iter().cloned().chain([me]));
        if next.addrs().map(str::to_owned).collect::<Vec<_>>() != current {
            match Members::build(addrs, &dialer) {
                Ok(m) => {
                    tracing::info!(peers = ?m.ring().addrs().collect::<Vec<_>>(), "peers changed");
                    members.store(Arc::new(m));
                    changes.record(clock.now());
                }
                Err(e) => tracing::warn!(error = %e, "cannot use the resolved peers"),
            }
        }
    }
}
