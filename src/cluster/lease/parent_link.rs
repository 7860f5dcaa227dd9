//! SLUICE_LEASE_PARENT's calls: the key owners of a lease cluster asking the parent cluster
//! for their keys' capacity ([`super::lease::parent`] is the logic). One task renews every key
//! this node owns and leases, every SLUICE_LEASE_PARENT_RENEW_MS, in one Lease call per parent
//! peer (the key's owner among the parent's peers, by the same rendezvous hashing), under this
//! cluster's name; and an owner asked about a key it holds no grant for asks the parent at
//! once, waiting for its answer at most as long as the call may take
//! (SLUICE_LEASE_PARENT_TIMEOUT_MS: the nodes' Lease calls to their owners allow for it). A
//! call that fails, or is not answered by then, makes the parent unreachable: the answer comes
//! from the safe capacity, and no request waits past that deadline.
//!
//! A parent peer whose call fails is skipped for [`DOWN_FOR`], its keys asked of the next one
//! (a stand-in, which rebuilds them from this cluster's reports): the parent's peers, their
//! clients and those marks are a [`PeerRing`], the core the cluster's own membership shares.
//! Calls use the peer listener's protocol and SLUICE_PEER_TLS: the tree shares one CA.
//!
//! A link with no key to renew still calls each parent peer (an empty Lease call) while the
//! parent was never reached or is unreachable, so the state shows from start, traffic or not;
//! and while it lasts (from [`START_GRACE`] after start for a parent never reached) a warning
//! is logged every [`WARN_EVERY`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::parent::{ParentView, Upstream};
use super::window::micros;
use super::{Ask, Capacity, Grant, LeaseServer, MAX_LEASE_ASKS};
use crate::clock::{Clock, Timestamp};
use crate::cluster::peer::{LeaseAsk, PeerClient, PeerError};
use crate::cluster::ring::{PeerRing, Ring};
use crate::cluster::{ClusterConfig, ClusterStats, ParentConfig, StartError};
use crate::tls::PeerTls;

/// How long a parent peer whose call failed is skipped.
const DOWN_FOR: Duration = Duration::from_secs(1);

/// How long after start a parent that never answered is warned of even if no call failed.
const START_GRACE: Duration = Duration::from_secs(5);

/// How often the warning is repeated while the parent was never reached or is unreachable.
pub(crate) const WARN_EVERY: Duration = Duration::from_secs(60);

/// A link started, and its renewal task.
type Spawned = (Arc<ParentLink>, tokio::task::JoinHandle<()>);

/// Whether this node owns a key on its own cluster's ring now.
pub(crate) type Owns = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// This node's link to the parent cluster.
pub struct ParentLink {
    pub upstream: Upstream,
    /// The parent's peers, a client each, and until when (µs) each is skipped.
    peers: PeerRing<PeerClient>,
    /// This cluster's name, which names its leases at the parent.
    name: String,
    clock: Arc<dyn Clock>,
    /// How long an owner's answer waits for the parent on a key with no grant: the calls'
    /// deadline.
    wait: Duration,
    /// When the link started, and when it last warned (µs; 0: never).
    started_us: u64,
    warned_us: AtomicU64,
    /// Only the keys this node owns are renewed: after a ring change in the cluster, the new
    /// owner renews a key under the cluster's name, and two owners must not report it.
    owns: Owns,
}

impl ParentLink {
    /// The link to the cluster's parent (SLUICE_LEASE_PARENT), and its renewal task for the
    /// keys `server` leases; `None` without a parent (or outside lease mode).
    pub(in crate::cluster) fn spawn(
        settings: &ClusterConfig,
        (server, owns): (Option<&Arc<LeaseServer>>, Owns),
        tls: Option<PeerTls>,
        (stats, clock): (Arc<ClusterStats>, Arc<dyn Clock>),
    ) -> Result<Option<Spawned>, StartError> {
        let (Some(config), Some(server)) = (&settings.parent, server) else {
            return Ok(None);
        };
        let mut link = Self::start(config, tls.as_ref(), stats, clock)?;
        link.owns = owns;
        let link = Arc::new(link);
        let task = tokio::spawn(link.clone().renew_forever(server.clone()));
        Ok(Some((link, task)))
    }

    fn start(
        config: &ParentConfig,
        tls: Option<&PeerTls>,
        stats: Arc<ClusterStats>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StartError> {
        let ring = Ring::new(config.peers.iter().cloned());
        let timing = config.timing;
        let clients = ring
            .addrs()
            .map(|a| PeerClient::start(a, timing.timeout, Duration::ZERO, tls, stats.clone()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(StartError::Parent)?;
        let started_us = clock.now().micros();
        Ok(ParentLink {
            upstream: Upstream::new(timing, config.expected_clusters),
            peers: PeerRing::new(ring, clients),
            name: config.name.clone(),
            clock,
            wait: timing.timeout,
            started_us,
            warned_us: AtomicU64::new(0),
            owns: Arc::new(|_| true),
        })
    }

    /// Each ask's capacity for this node's lease server at `now`: what the parent granted.
    /// Keys it granted nothing for in the window are asked of it at once first, waiting at
    /// most the call's deadline: a call not answered by then makes the parent unreachable, and
    /// those keys get the safe capacity; `now` moves to when the wait ended.
    pub async fn capacities<K: AsRef<str>>(
        self: &Arc<Self>,
        server: &Arc<LeaseServer>,
        asks: &[(K, Ask)],
        now: &mut Timestamp,
    ) -> Vec<Capacity> {
        let of = |(key, ask): &(K, Ask), now: Timestamp| {
            self.upstream
                .capacity(key.as_ref(), &ask.quota, now.micros())
        };
        let mut capacities: Vec<_> = asks.iter().map(|a| of(a, *now)).collect();
        let waiting: Vec<(&str, Ask)> = asks
            .iter()
            .zip(&capacities)
            .filter(|(_, (_, _, ask_now))| *ask_now)
            .map(|((key, ask), _)| (key.as_ref(), *ask))
            .collect();
        if waiting.is_empty() {
            return capacities.into_iter().map(|c| c.0).collect();
        }
        let sent = self.clock.now();
        let owns = |_: &str| true;
        let due = self
            .upstream
            .renewals(sent.micros(), Some(&waiting), owns, |k| {
                server.summary(k, sent)
            });
        if !due.is_empty() {
            let link = self.clone();
            let call = tokio::spawn(async move { link.send(due).await });
            if tokio::time::timeout(self.wait, call).await.is_err() {
                // The call's own deadline ends it about now, as a failure.
                self.upstream.lost(self.clock.now().micros());
            }
        }
        *now = self.clock.now();
        for (a, c) in asks.iter().zip(&mut capacities) {
            if c.2 {
                *c = of(a, *now);
            }
        }
        capacities.into_iter().map(|c| c.0).collect()
    }

    /// Renews every key at the parent every SLUICE_LEASE_PARENT_RENEW_MS; with none to renew,
    /// calls the parent anyway while it was never reached or is unreachable.
    async fn renew_forever(self: Arc<Self>, server: Arc<LeaseServer>) {
        let mut tick = tokio::time::interval(self.upstream.timing().renew);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = self.clock.now();
            let owns = |k: &str| (self.owns)(k);
            let due = self
                .upstream
                .renewals(now.micros(), None, owns, |k| server.summary(k, now));
            if due.is_empty() && (!self.upstream.reached() || self.upstream.unreachable()) {
                self.probe().await;
            } else {
                self.send(due).await;
            }
            self.warn_if_due(self.clock.now().micros());
        }
    }

    /// One empty Lease call to each parent peer not skipped: whether the parent answers.
    async fn probe(&self) {
        let sent_us = self.clock.now().micros();
        let up: Vec<usize> = (0..self.peers.ring().len())
            .filter(|&i| self.peers.up(i, sent_us))
            .collect();
        if up.is_empty() {
            self.upstream.lost(sent_us);
        }
        let calls = up.into_iter().map(|i| async move {
            let result = self.peers.client(i).lease(&self.name, Vec::new()).await;
            let now_us = self.clock.now().micros();
            self.upstream.called(result.is_ok(), sent_us, now_us);
            if let Err(e) = result {
                self.failed(i, &e, now_us);
            }
        });
        futures_util::future::join_all(calls).await;
    }

    /// Logs the link's warning at `now_us` if it has one and the last was [`WARN_EVERY`] ago:
    /// while the parent is unreachable, or was never reached and [`START_GRACE`] has passed.
    fn warn_if_due(&self, now_us: u64) {
        let Some(warning) = self.upstream.warning() else {
            return;
        };
        let young = now_us < self.started_us + micros(START_GRACE);
        if young && !self.upstream.unreachable() {
            return;
        }
        // The parent became unreachable at `unreachable_since_us`, and `lost` warned then.
        let last = self
            .warned_us
            .load(Ordering::Relaxed)
            .max(self.upstream.unreachable_since_us());
        if last != 0 && now_us < last + micros(WARN_EVERY) {
            return;
        }
        self.warned_us.store(now_us, Ordering::Relaxed);
        let since_s = now_us.saturating_sub(self.started_us) / 1_000_000;
        tracing::warn!(parent = self.peers(), since_start_s = since_s, "{warning}");
    }

    /// Parent peer `i` failed a call with `e` at `now_us`: it is skipped for [`DOWN_FOR`].
    fn failed(&self, i: usize, e: &PeerError, now_us: u64) {
        tracing::warn!(parent = self.peers.ring().addr(i), error = %e, "lease parent call failed");
        self.peers.mark(i, now_us + micros(DOWN_FOR));
    }

    /// Sends `due` to the parent: one call per parent peer (in chunks of [`MAX_LEASE_ASKS`]),
    /// all at once; each grant (or failure) goes to its key.
    async fn send(&self, due: Vec<(Box<str>, Ask)>) {
        if due.is_empty() {
            return;
        }
        let sent_us = self.clock.now().micros();
        let mut by_owner: Vec<Vec<(Box<str>, Ask)>> = vec![Vec::new(); self.peers.ring().len()];
        let mut orphans = Vec::new();
        for item in due {
            match self.peers.owner(&item.0, sent_us) {
                Some(i) => by_owner[i].push(item),
                None => orphans.push(item),
            }
        }
        if !orphans.is_empty() {
            // Every parent peer failed a call within the last second.
            self.upstream.lost(sent_us);
            for (key, _) in &orphans {
                self.upstream.answer(key, None, sent_us);
            }
        }
        let calls = by_owner
            .iter()
            .enumerate()
            .flat_map(|(i, items)| items.chunks(MAX_LEASE_ASKS).map(move |chunk| (i, chunk)));
        let calls = calls.map(|(i, chunk)| async move {
            let wire = chunk
                .iter()
                .map(|(k, a)| LeaseAsk::from_ask(k, a))
                .collect();
            self.upstream
                .stats
                .asks
                .fetch_add(chunk.len() as u64, Ordering::Relaxed);
            let result = self.peers.client(i).lease(&self.name, wire).await;
            let now_us = self.clock.now().micros();
            self.upstream.called(result.is_ok(), sent_us, now_us);
            match result {
                Ok(grants) if grants.len() == chunk.len() => {
                    for ((key, _), g) in chunk.iter().zip(&grants) {
                        self.upstream.answer(key, Some(&Grant::from(g)), sent_us);
                    }
                }
                other => {
                    match &other {
                        Err(e) => self.failed(i, e, now_us),
                        Ok(_) => {
                            self.peers.mark(i, now_us + micros(DOWN_FOR));
                        }
                    }
                    for (key, _) in chunk {
                        self.upstream.answer(key, None, sent_us);
                    }
                }
            }
        });
        futures_util::future::join_all(calls).await;
    }

    /// SLUICE_LEASE_PARENT's addresses, comma-separated.
    pub fn peers(&self) -> String {
        self.peers.ring().addrs().collect::<Vec<_>>().join(",")
    }

    /// `key`'s parent grant, for the debug endpoint.
    pub fn view(&self, key: &str) -> Option<ParentView> {
        let now_us = self.clock.now().micros();
        let parent = self
            .peers
            .owner(key, now_us)
            .map_or("(none reachable)", |i| self.peers.ring().addr(i));
        self.upstream.view(key, parent, now_us)
    }
}
