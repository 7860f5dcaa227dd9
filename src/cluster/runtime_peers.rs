//! Runtime limits across the peer cluster (docs/runtime-limits.md): every node holds every
//! runtime limit. A change made through a node's API is pushed to every peer before the API
//! answers; a node pulls a peer's whole set, page by page, when the peer first answers and
//! whenever it answers again after being down, so a node that was down or cut off catches up
//! when it returns, and so do its peers with what it changed meanwhile. Of two changes to one
//! path the later stamp wins on every node ([`crate::config::runtime::Stamp`]), and removals
//! are remembered a day, so the order changes arrive in does not matter.

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::Members;
use super::peer::{LimitsOwner, wire};
use crate::config::ConfigHandle;
use crate::config::runtime::{Applied, Replicated};

/// The most changes one push carries.
const MAX_PUSH: usize = 1024;

/// A pull's page: at most this many entries, and no more once its bodies pass [`PAGE_BYTES`].
const PAGE_ENTRIES: usize = 1000;
const PAGE_BYTES: usize = 1 << 20;

/// The most pages one catch-up pulls: 10 million entries, past any SLUICE_MAX_RUNTIME_LIMITS.
const MAX_PAGES: usize = 10_000;

/// This node's runtime limits among its peers.
pub struct PeerLimits {
    config: ConfigHandle,
    members: Arc<ArcSwap<Members>>,
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for PeerLimits {
    fn drop(&mut self) {
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = task {
            t.abort();
        }
    }
}

fn to_wire(c: &Replicated) -> wire::RuntimeLimitChange {
    wire::RuntimeLimitChange {
        domain: c.domain.clone(),
        levels: c
            .levels
            .iter()
            .map(|(key, value)| wire::RuntimeLevel {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
        body: c.body.as_ref().map(serde_json::Value::to_string),
        at_us: c.at_us,
        origin: c.origin.clone(),
    }
}

fn from_wire(c: wire::RuntimeLimitChange) -> Result<Replicated, String> {
    let body = c
        .body
        .map(|b| serde_json::from_str(&b))
        .transpose()
        .map_err(|e| format!("a runtime limit's body is not JSON: {e}"))?;
    Ok(Replicated {
        domain: c.domain,
        levels: c.levels.into_iter().map(|l| (l.key, l.value)).collect(),
        body,
        at_us: c.at_us,
        origin: c.origin,
    })
}

impl PeerLimits {
    pub(super) fn new(
        config: ConfigHandle,
        members: Arc<ArcSwap<Members>>,
        mut returned: tokio::sync::mpsc::Receiver<String>,
    ) -> Arc<Self> {
        let limits = Arc::new(PeerLimits {
            config,
            members,
            task: std::sync::Mutex::new(None),
        });
        let weak = Arc::downgrade(&limits);
        let task = tokio::spawn(async move {
            while let Some(peer) = returned.recv().await {
                let Some(limits) = weak.upgrade() else {
                    return;
                };
                match limits.catch_up(&peer).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(peer, changes = n, "runtime limits caught up"),
                    Err(e) => {
                        tracing::warn!(peer, error = %e, "cannot pull the peer's runtime limits");
                    }
                }
            }
        });
        *limits.task.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        limits
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

    /// Pushes `change` to every peer at once; the peers that did not take it, with why. A
    /// peer that missed it pulls it when it answers again, so a failed push marks no peer down.
    pub async fn push(&self, change: &Replicated) -> Vec<String> {
        let m = self.members.load_full();
        let (ring, me) = (&m.ring, m.ring.addr(m.me));
        let calls = m.clients.iter().enumerate().filter_map(|(i, c)| {
            c.as_ref().map(|c| async move {
                let pushed = c.limits(me, vec![to_wire(change)], None).await;
                pushed.err().map(|e| format!("{}: {e}", ring.addr(i)))
            })
        });
        futures_util::future::join_all(calls)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Pulls `peer`'s whole set and applies it; the number of changes that changed something.
    async fn catch_up(&self, peer: &str) -> Result<usize, String> {
        let m = self.members.load_full();
        let client = m
            .ring
            .index_of(peer)
            .and_then(|i| m.clients[i].as_ref())
            .ok_or_else(|| format!("{peer} is no longer a peer"))?;
        let me = m.ring.addr(m.me).to_owned();
        let mut after = String::new();
        let mut applied = 0;
        for _ in 0..MAX_PAGES {
            let (page, next) = client
                .limits(&me, Vec::new(), Some(after))
                .await
                .map_err(|e| e.to_string())?;
            let page: Vec<Replicated> =
                page.into_iter().map(from_wire).collect::<Result<_, _>>()?;
            applied += self.apply_all(&page);
            if next.is_empty() {
                return Ok(applied);
            }
            after = next;
        }
        Err(format!("more than {MAX_PAGES} pages"))
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
            .map_err(tonic::Status::invalid_argument)?;
        if !changes.is_empty() {
            let applied = self.apply_all(&changes);
            tracing::debug!(node, applied, "runtime limit changes from a peer");
        }
        Ok(())
    }

    fn pull(&self, after: &str) -> (Vec<wire::RuntimeLimitChange>, String) {
        let all = self.config.runtime(|s| s.export());
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
        (page, next)
    }
}
