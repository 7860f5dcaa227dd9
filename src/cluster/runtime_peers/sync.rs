//! Reconciling this node's runtime limits with a peer's, and the anti-entropy pass that picks
//! the peer to compare with every SLUICE_RUNTIME_LIMITS_SYNC_MS.
//!
//! Reconciling is one-sided, so that two nodes never both pull the same difference: the node
//! that found it pulls the peer's whole set (pages in key order), applies it, and pushes back
//! each change of its own that the peer's pages lack or hold with an earlier stamp. Both then
//! hold the later of every change, whoever made it. A peer that has just answered and holds
//! nothing is starting: it pulls every peer's set itself, so nothing is pushed back to it
//! (which would send it every limit once per peer).

use std::collections::HashMap;
use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::convert::{BadBody, digest_from_wire, from_wire, to_wire};
use super::{FIRST_PULL_WAIT, MAX_PAGES, MAX_PUSH, PeerLimits};
use crate::cluster::members::Members;
use crate::cluster::peer::{PeerClient, PeerError};
use crate::config::runtime::{Replicated, Stamp};

/// Why this node compares with a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Occasion {
    /// It answered for the first time, or again after being down.
    Returned,
    /// The anti-entropy pass.
    Pass,
}

/// What comparing with a peer found.
#[derive(Debug, PartialEq, Eq)]
enum Compared {
    /// The same digest: nothing to do.
    Same,
    /// Another digest, or a peer that does not compare when reconciling anyway: the changes
    /// applied here and pushed there.
    Reconciled { here: usize, there: usize },
    /// A peer that predates the comparison, left alone by the pass (it is reconciled with
    /// when it answers again after being down).
    Unknown,
}

/// Reconciles with each peer that answered for the first time or again after being down (the
/// probes' queue); the first load is done once one succeeded with no other waiting.
pub(super) async fn reconcile_returned(
    weak: Weak<PeerLimits>,
    mut returned: tokio::sync::mpsc::Receiver<String>,
) {
    let started = tokio::time::Instant::now();
    while let Some(peer) = returned.recv().await {
        let Some(limits) = weak.upgrade() else {
            return;
        };
        limits.reconciling.store(true, Ordering::SeqCst);
        let reconciled = limits.reconcile_returned(&peer, &returned, started).await;
        limits.reconciling.store(false, Ordering::SeqCst);
        if returned.is_empty() {
            if reconciled {
                limits.mark_loaded();
            } else if started.elapsed() >= FIRST_PULL_WAIT {
                limits.ready_without_a_peer();
            }
        }
    }
}

/// After [`FIRST_PULL_WAIT`], the first load is done unless a pull is under way: no peer
/// answered, so a cluster starting from nothing still becomes ready.
pub(super) async fn wait_first_pull(weak: Weak<PeerLimits>) {
    tokio::time::sleep(FIRST_PULL_WAIT).await;
    if let Some(limits) = weak.upgrade()
        && !limits.reconciling.load(Ordering::SeqCst)
    {
        limits.ready_without_a_peer();
    }
}

/// How long after its start a node not yet loaded tries a peer that answered its probe but
/// not its pull again (every [`FIRST_PULL_RETRY`]) before it reports ready without it: a
/// pull's first page waits for the peer to sort its set, which past a call's deadline on a
/// loaded machine succeeds the second time (the sorted set is kept while nothing changes).
const FIRST_PULL_RETRIES_FOR: Duration = Duration::from_secs(30);
const FIRST_PULL_RETRY: Duration = Duration::from_secs(1);

/// The anti-entropy pass, every `interval` (the first one interval after the start, when the
/// peers that answered have been reconciled with already).
pub(super) async fn every(weak: Weak<PeerLimits>, interval: Duration) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut turn = 0;
    loop {
        tick.tick().await;
        let Some(limits) = weak.upgrade() else {
            return;
        };
        limits.pass(&mut turn).await;
    }
}

/// This node's changes (sorted by key) up to `end`, or all that are left when `None`, that the
/// peer's `page` (the keys after the previous page's end, up to `end`) lacks or holds with an
/// earlier stamp.
fn lacking(
    mine: &mut std::iter::Peekable<impl Iterator<Item = (String, Replicated)>>,
    page: &[Replicated],
    end: Option<&str>,
) -> Vec<Replicated> {
    let theirs: HashMap<String, Stamp> = page.iter().map(|r| (r.key(), r.stamp())).collect();
    let mut out = Vec::new();
    while let Some((key, change)) = mine.next_if(|(key, _)| end.is_none_or(|e| key.as_str() <= e)) {
        if theirs.get(&key).is_none_or(|s| *s < change.stamp()) {
            out.push(change);
        }
    }
    out
}

/// The next peer after `turn` in the ring that is up, round robin.
fn next_up(m: &Members, turn: &mut usize) -> Option<String> {
    let (n, from) = (m.ring().len(), *turn);
    let i = (0..n)
        .map(|step| (from + step) % n)
        .find(|&i| i != m.me && m.client(i).is_some() && m.up(i))?;
    *turn = i + 1;
    Some(m.ring().addr(i).to_owned())
}

impl PeerLimits {
    /// Reconciles with `peer`, which answered for the first time or again; before the first
    /// load is done, tries again while no other peer waits, for a while. Whether it succeeded.
    async fn reconcile_returned(
        &self,
        peer: &str,
        others: &tokio::sync::mpsc::Receiver<String>,
        started: tokio::time::Instant,
    ) -> bool {
        loop {
            match self.sync_with(peer, Occasion::Returned).await {
                Ok(found) => {
                    self.count(peer, &found);
                    return true;
                }
                Err(e) => {
                    self.counters.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(peer, error = %e, "cannot reconcile the runtime limits with a peer");
                }
            }
            let retry = !*self.loaded.borrow()
                && others.is_empty()
                && started.elapsed() < FIRST_PULL_RETRIES_FOR;
            if !retry {
                return false;
            }
            tokio::time::sleep(FIRST_PULL_RETRY).await;
        }
    }

    /// The first load done without a peer's set.
    fn ready_without_a_peer(&self) {
        if self.mark_loaded() {
            tracing::warn!(
                wait = ?FIRST_PULL_WAIT,
                limits = self.config.runtime(|s| s.len()),
                "no peer's runtime limits pulled: ready with those this node holds"
            );
        }
    }

    /// One pass: compares with each peer a push missed since the last pass that is still up
    /// (one that went down is reconciled with when it answers again), or else with the next
    /// peer up in turn; reconciles where the digests differ.
    async fn pass(&self, turn: &mut usize) {
        let m = self.members.load_full();
        let missed = std::mem::take(&mut *self.missed.lock().unwrap_or_else(|e| e.into_inner()));
        let is_up = |p: &String| m.ring().index_of(p).is_some_and(|i| m.up(i));
        let mut peers: Vec<String> = missed.into_iter().filter(is_up).collect();
        let retrying = !peers.is_empty();
        if !retrying {
            peers.extend(next_up(&m, turn));
        }
        let compared = peers.iter().map(|p| self.sync_with(p, Occasion::Pass));
        let results = futures_util::future::join_all(compared).await;
        for (peer, result) in peers.iter().zip(results) {
            match result {
                Ok(found) => {
                    self.count(peer, &found);
                    self.mark_loaded();
                }
                Err(e) => {
                    self.counters.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(peer, error = %e, "cannot compare the runtime limits with a peer; trying again at the next pass");
                    if retrying && is_up(peer) {
                        let mut missed = self.missed.lock().unwrap_or_else(|e| e.into_inner());
                        missed.insert(peer.clone());
                    }
                }
            }
        }
    }

    /// Counts and logs what comparing with `peer` found.
    fn count(&self, peer: &str, found: &Compared) {
        match *found {
            Compared::Same => {
                self.counters.same.fetch_add(1, Ordering::Relaxed);
            }
            Compared::Reconciled { here, there } => {
                self.counters.differed.fetch_add(1, Ordering::Relaxed);
                if here + there > 0 {
                    tracing::info!(
                        peer,
                        applied_here = here,
                        pushed_there = there,
                        "runtime limits reconciled with a peer"
                    );
                }
            }
            Compared::Unknown => {
                tracing::debug!(peer, "a peer that predates the runtime limits' digest");
            }
        }
    }

    /// Compares digests with `peer` and reconciles when they differ. A peer that answers no
    /// digest (it predates it) is reconciled with only when it has just answered.
    async fn sync_with(&self, peer: &str, occasion: Occasion) -> Result<Compared, SyncError> {
        let (client, me) = self.client(peer)?;
        let ours = self.config.runtime(|s| s.digest());
        let answer = client.limits(&me, Vec::new(), None, true).await?;
        let theirs = answer.digest.map(digest_from_wire);
        if theirs == Some(ours) {
            return Ok(Compared::Same);
        }
        if theirs.is_none() && occasion == Occasion::Pass {
            return Ok(Compared::Unknown);
        }
        let starting = occasion == Occasion::Returned && theirs.is_some_and(|d| d.entries == 0);
        let (here, there) = self.reconcile(&client, &me, !starting).await?;
        Ok(Compared::Reconciled { here, there })
    }

    /// The client for `peer`, and this node's address.
    fn client(&self, peer: &str) -> Result<(PeerClient, String), SyncError> {
        let m = self.members.load_full();
        let client = m
            .ring()
            .index_of(peer)
            .and_then(|i| m.client(i).cloned())
            .ok_or_else(|| SyncError::Gone(peer.to_owned()))?;
        Ok((client, m.ring().addr(m.me).to_owned()))
    }

    /// Pulls the peer's whole set and applies it, and with `push_back` pushes back every change
    /// of this node's (as held before the pull) that the peer lacks or holds older; the
    /// changes applied here and pushed there. Changes made meanwhile reach the peer by their
    /// own pushes.
    async fn reconcile(
        &self,
        client: &PeerClient,
        me: &str,
        push_back: bool,
    ) -> Result<(usize, usize), SyncError> {
        let ours = if push_back {
            self.config.runtime(|s| s.export())
        } else {
            Vec::new()
        };
        let mut mine = ours.into_iter().peekable();
        let (mut applied, mut pushed) = (0, 0);
        let mut back: Vec<Replicated> = Vec::new();
        let mut after = String::new();
        for _ in 0..MAX_PAGES {
            let answer = client.limits(me, Vec::new(), Some(after), false).await?;
            let page: Vec<Replicated> = answer
                .entries
                .into_iter()
                .map(from_wire)
                .collect::<Result<_, _>>()?;
            applied += self.apply_all(&page);
            let last = answer.next.is_empty();
            let end = (!last).then_some(answer.next.as_str());
            back.extend(lacking(&mut mine, &page, end));
            while back.len() >= MAX_PUSH || (last && !back.is_empty()) {
                let batch: Vec<_> = back.drain(..back.len().min(MAX_PUSH)).collect();
                client
                    .limits(me, batch.iter().map(to_wire).collect(), None, false)
                    .await?;
                pushed += batch.len();
            }
            if last {
                return Ok((applied, pushed));
            }
            after = answer.next;
        }
        Err(SyncError::TooManyPages)
    }
}

/// Why a comparison or reconciliation with a peer failed (tried again at the next pass).
#[derive(Debug, thiserror::Error)]
enum SyncError {
    #[error("{0} is no longer a peer")]
    Gone(String),
    #[error(transparent)]
    Call(#[from] PeerError),
    #[error(transparent)]
    Body(#[from] BadBody),
    #[error("more than {MAX_PAGES} pages")]
    TooManyPages,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(value: &str, at_us: u64) -> Replicated {
        Replicated {
            domain: "d".to_owned(),
            levels: vec![("k".to_owned(), Some(value.to_owned()))],
            body: Some(serde_json::json!({"unit": "hour", "requests_per_unit": 1})),
            at_us,
            origin: "n1".to_owned(),
        }
    }

    #[test]
    fn what_a_peer_lacks_or_holds_older_is_pushed_back_page_by_page() {
        let mine = ["a", "b", "c", "d", "e"].map(|v| change(v, 5));
        let mut mine = mine.into_iter().map(|c| (c.key(), c)).peekable();
        let names = |cs: Vec<Replicated>| -> Vec<String> {
            cs.iter().map(|c| c.levels[0].1.clone().unwrap()).collect()
        };
        // The first page ends at b: the peer holds a as here and b older.
        let page = [change("a", 5), change("b", 3)];
        let end = change("b", 0).key();
        assert_eq!(names(lacking(&mut mine, &page, Some(&end))), ["b"]);
        // The last page: the peer lacks c, holds d later, and e the same.
        let page = [change("d", 9), change("e", 5)];
        assert_eq!(names(lacking(&mut mine, &page, None)), ["c"]);
        assert!(mine.next().is_none());
    }
}
