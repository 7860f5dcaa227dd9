//! Runtime limits across the peer cluster (docs/runtime-limits.md): every node holds every
//! runtime limit.
//!
//! - **Push**: a change made through a node's API is pushed to every peer before the API
//!   answers; the answer names the peers that did not take it, and the next anti-entropy pass
//!   compares with those first.
//! - **Reconciling with a peer** ([`sync`]): pulling its whole set, page by page, applying it,
//!   and pushing back what it lacks or holds older, so both hold the later of every change.
//!   Done with a peer when it first answers and whenever it answers again after being down.
//! - **Anti-entropy** ([`sync`]): every SLUICE_RUNTIME_LIMITS_SYNC_MS a node compares its digest
//!   ([`crate::config::runtime::Digest`]) with one peer's, round robin, or with the peers its
//!   pushes missed since the last pass; when they differ it reconciles with that peer. When
//!   nothing differs a pass costs one small call.
//! - **Readiness** ([`PeerLimits::loaded`]): true once this node has reconciled with a peer
//!   (and no other that answered is waiting), or after [`FIRST_PULL_WAIT`] when none did, so a
//!   whole cluster can still start from nothing; at once when PEERS names no other node.
//!
//! Of two changes to one path the later stamp wins on every node
//! ([`crate::config::runtime::Stamp`]), and removals are remembered a day, so the order changes
//! arrive in does not matter.

mod convert;
mod sync;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;

use super::members::Members;
use super::peer::{LimitsOwner, wire};
use crate::config::ConfigHandle;
use crate::config::runtime::{Applied, Replicated};
use crate::runtime_limits::{Settling, Sink, SyncCounts};
use convert::{digest_to_wire, from_wire, to_wire};

/// The most changes one push carries.
const MAX_PUSH: usize = 1024;

/// A pull's page: at most this many entries, and no more once its bodies pass [`PAGE_BYTES`].
const PAGE_ENTRIES: usize = 1000;
const PAGE_BYTES: usize = 1 << 20;

/// The most pages one catch-up pulls: 10 million entries, past any SLUICE_MAX_RUNTIME_LIMITS.
const MAX_PAGES: usize = 10_000;

/// How long a starting node waits for a peer to answer before it reports ready with the
/// runtime limits it holds: the first node of a new cluster has no peer to wait for, and peers
/// that start together answer each other's probes (every 500 ms) well within it. A pull under
/// way then is waited for (each of its calls bounded by SLUICE_PEER_TIMEOUT_MS).
pub(crate) const FIRST_PULL_WAIT: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Counters {
    same: AtomicU64,
    differed: AtomicU64,
    failed: AtomicU64,
    missed_pushes: AtomicU64,
}

/// Every limit and remembered removal, by key, sorted: what pulling peers page through.
type Exported = Arc<Vec<(String, Replicated)>>;

/// This node's runtime limits among its peers.
pub struct PeerLimits {
    config: ConfigHandle,
    members: Arc<ArcSwap<Members>>,
    /// The peers a push missed since the last pass: compared first at the next.
    missed: Mutex<BTreeSet<String>>,
    /// Whether the first load is done (readiness).
    loaded: watch::Sender<bool>,
    counters: Counters,
    /// Whether a peer that answered is being reconciled with (from its return): the first
    /// load waits for it past [`FIRST_PULL_WAIT`].
    reconciling: std::sync::atomic::AtomicBool,
    /// The last export answered page by page to pulling peers, with the change number it was
    /// made at: the pages of one pull share it while nothing changes, and the last page lets it
    /// go (it holds a copy of every limit).
    exported: Mutex<Option<(u64, Exported)>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Drop for PeerLimits {
    fn drop(&mut self) {
        for t in self
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            t.abort();
        }
    }
}

impl PeerLimits {
    /// Starts reconciling with each peer in `returned` (those that answered first or again),
    /// comparing digests with a peer every `sync`, and the wait for readiness. Inside a tokio
    /// runtime.
    pub(super) fn new(
        config: ConfigHandle,
        members: Arc<ArcSwap<Members>>,
        returned: tokio::sync::mpsc::Receiver<String>,
        sync: Duration,
    ) -> Arc<Self> {
        let limits = Arc::new(PeerLimits {
            config,
            members,
            missed: Mutex::default(),
            loaded: watch::Sender::new(false),
            counters: Counters::default(),
            reconciling: std::sync::atomic::AtomicBool::new(false),
            exported: Mutex::default(),
            tasks: Mutex::default(),
        });
        let weak = Arc::downgrade(&limits);
        let tasks = vec![
            tokio::spawn(sync::reconcile_returned(weak.clone(), returned)),
            tokio::spawn(sync::every(weak.clone(), sync)),
            tokio::spawn(sync::wait_first_pull(weak)),
        ];
        *limits.tasks.lock().unwrap_or_else(|e| e.into_inner()) = tasks;
        limits
    }

    /// Whether the first load of the runtime limits is done, now and at every change: once a
    /// peer's set has been pulled, or after [`FIRST_PULL_WAIT`] when none is being pulled.
    pub fn loaded(&self) -> watch::Receiver<bool> {
        self.loaded.subscribe()
    }

    /// Marks the first load done (a node alone in PEERS has nothing to wait for); whether it
    /// was not before.
    pub(super) fn mark_loaded(&self) -> bool {
        self.loaded
            .send_if_modified(|l| !std::mem::replace(l, true))
    }

    /// What the pushes and passes did so far.
    pub fn counts(&self) -> SyncCounts {
        let c = &self.counters;
        SyncCounts {
            same: c.same.load(Ordering::Relaxed),
            differed: c.differed.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            missed_pushes: c.missed_pushes.load(Ordering::Relaxed),
        }
    }

    /// Applies changes from elsewhere; the number that changed something here.
    fn apply_all(&self, changes: &[Replicated]) -> usize {
        self.config.change(|s| {
            let mut applied = 0;
            for c in changes {
                match s.apply(c) {
                    Applied::Set | Applied::Removed => applied += 1,
                    Applied::Stale => {}
                    Applied::Refused(e) => {
                        tracing::warn!(domain = %c.domain, error = %e, "a peer's runtime limit is refused here");
                    }
                }
            }
            applied
        })
    }

    /// Pushes `change` to every peer at once; the peers that did not take it, with why. Each
    /// is compared with first at the next anti-entropy pass, which brings it the change; a
    /// failed push marks no peer down.
    pub async fn push(&self, change: &Replicated) -> Vec<(String, String)> {
        let m = self.members.load_full();
        let (ring, me) = (m.ring(), m.ring().addr(m.me));
        let calls = m.clients().map(|(i, c)| async move {
            let pushed = c.limits(me, vec![to_wire(change)], None, false).await;
            pushed
                .err()
                .map(|e| (ring.addr(i).to_owned(), e.to_string()))
        });
        let missed: Vec<(String, String)> = futures_util::future::join_all(calls)
            .await
            .into_iter()
            .flatten()
            .collect();
        if !missed.is_empty() {
            self.counters
                .missed_pushes
                .fetch_add(missed.len() as u64, Ordering::Relaxed);
            let mut retry = self.missed.lock().unwrap_or_else(|e| e.into_inner());
            retry.extend(missed.iter().map(|(peer, _)| peer.clone()));
        }
        missed
    }

    /// Every limit and remembered removal, sorted by key, shared by the pages of one pull
    /// while nothing changes (a pull of 100,000 limits is 100 pages).
    fn export(&self) -> Exported {
        let mut cached = self.exported.lock().unwrap_or_else(|e| e.into_inner());
        let (sequence, all) = self.config.runtime(|s| match cached.as_ref() {
            Some((at, all)) if *at == s.sequence() => (*at, Arc::clone(all)),
            _ => (s.sequence(), Arc::new(s.export())),
        });
        *cached = Some((sequence, Arc::clone(&all)));
        all
    }
}

impl LimitsOwner for PeerLimits {
    fn push(
        &self,
        node: &str,
        changes: Vec<wire::RuntimeLimitChange>,
    ) -> Result<(), tonic::Status> {
        if changes.len() > MAX_PUSH {
            return Err(tonic::Status::invalid_argument(format!(
                "a limits call carries at most {MAX_PUSH} changes, not {}",
                changes.len()
            )));
        }
        let changes: Vec<Replicated> = changes
            .into_iter()
            .map(from_wire)
            .collect::<Result<_, _>>()
            .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
        if !changes.is_empty() {
            let applied = self.apply_all(&changes);
            tracing::debug!(node, applied, "runtime limit changes from a peer");
        }
        Ok(())
    }

    fn pull(&self, after: &str) -> (Vec<wire::RuntimeLimitChange>, String) {
        let all = self.export();
        let start = all.partition_point(|(key, _)| key.as_str() <= after);
        let mut page = Vec::new();
        let mut bytes = 0;
        let mut last = None;
        for (key, change) in &all[start..] {
            if page.len() == PAGE_ENTRIES || bytes > PAGE_BYTES {
                break;
            }
            let w = to_wire(change);
            bytes += w.body.as_ref().map_or(0, String::len) + key.len();
            page.push(w);
            last = Some(key);
        }
        let more = start + page.len() < all.len();
        let next = match (more, last) {
            (true, Some(key)) => key.clone(),
            _ => String::new(),
        };
        if next.is_empty() {
            *self.exported.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        (page, next)
    }

    fn digest(&self) -> wire::LimitsDigest {
        digest_to_wire(self.config.runtime(|s| s.digest()))
    }
}

/// Every peer gets the change before the API answers. A peer that did not is logged and named
/// in the answer (the runtime limits API's missed-peers header), not answered as a failure: the
/// change holds here and on the peers that took it, and the next anti-entropy pass compares
/// with the peers it missed first, which brings it to them once they answer.
impl Sink for PeerLimits {
    fn settled<'a>(&'a self, _: u64, change: &'a Replicated) -> Settling<'a> {
        Box::pin(async move {
            let missed = self.push(change).await;
            for (peer, error) in &missed {
                tracing::warn!(peer, error, domain = %change.domain, "a peer did not take a runtime limit change; the next anti-entropy pass brings it");
            }
            Ok(missed.into_iter().map(|(peer, _)| peer).collect())
        })
    }

    fn sync_counts(&self) -> Option<SyncCounts> {
        Some(self.counts())
    }
}
