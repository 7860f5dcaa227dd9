//! The core every membership shares ([`PeerRing`]): a ring of peer addresses with one client
//! each, which peers are down, and the owner of a key among those up. The cluster's own
//! membership (`crate::cluster::members`) is one, and so is the link to a parent cluster of
//! lease servers (`crate::cluster::lease::parent_link`). It lives beside the hashing rather
//! than in `members`, which the lease code cannot import without a cycle (`members` uses the
//! write-behind's ring changes, whose settings name lease types).

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Ring, key_hash};

/// A peer's mark when it is not down: up at any time.
pub(in crate::cluster) const UP: u64 = 0;

/// A peer's mark when it is down until marked again: down at any time.
pub(in crate::cluster) const UNTIL_CLEARED: u64 = u64::MAX;

/// The peers of a ring, a client of type `C` for each (by index in the ring), and for each the
/// time until which it is down (µs; [`UP`]: not down).
///
/// Down is one "until" per peer rather than a flag because the two memberships differ only in
/// how a mark ends, and a time holds both: the parent link skips a parent peer whose call
/// failed for a while (marked `now + DOWN_FOR`, up again once that has passed, no probe
/// needed), while the cluster's `Members` marks a peer [`UNTIL_CLEARED`] after a failed call or
/// missed probes and only an answered probe clears it ([`UP`]). A membership whose marks are
/// only those two reads the same at any time. The other way, the check as a type parameter,
/// would add a trait and two implementations for what one comparison does.
pub(in crate::cluster) struct PeerRing<C> {
    ring: Ring,
    clients: Vec<C>,
    down_until_us: Vec<AtomicU64>,
}

impl<C> PeerRing<C> {
    /// The peers of `ring`, none down, with `clients[i]` the client of peer `i`.
    pub(in crate::cluster) fn new(ring: Ring, clients: Vec<C>) -> Self {
        debug_assert_eq!(ring.len(), clients.len(), "one client per peer");
        let down_until_us = (0..ring.len()).map(|_| AtomicU64::new(UP)).collect();
        PeerRing {
            ring,
            clients,
            down_until_us,
        }
    }

    pub(in crate::cluster) fn ring(&self) -> &Ring {
        &self.ring
    }

    /// Peer `i`'s client.
    pub(in crate::cluster) fn client(&self, i: usize) -> &C {
        &self.clients[i]
    }

    /// Each peer's index and client, in ring order.
    pub(in crate::cluster) fn clients(&self) -> impl Iterator<Item = (usize, &C)> {
        self.clients.iter().enumerate()
    }

    /// Whether peer `i` is up at `now_us`: its mark has run out, or it has none.
    pub(in crate::cluster) fn up(&self, i: usize, now_us: u64) -> bool {
        self.down_until_us[i].load(Ordering::Relaxed) <= now_us
    }

    /// Marks peer `i` down until `until_us` ([`UP`] clears it); the mark it had.
    pub(in crate::cluster) fn mark(&self, i: usize, until_us: u64) -> u64 {
        self.down_until_us[i].swap(until_us, Ordering::Relaxed)
    }

    /// The owner of `key` among the peers up at `now_us` (`None` if none is).
    pub(in crate::cluster) fn owner(&self, key: &str, now_us: u64) -> Option<usize> {
        self.ring.owner(key_hash(key), |i| self.up(i, now_us))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(n: usize) -> PeerRing<()> {
        PeerRing::new(
            Ring::new((0..n).map(|i| format!("10.0.0.{i}:8082"))),
            vec![(); n],
        )
    }

    /// A key and its owner while every peer is up.
    fn key_owned_by_one(p: &PeerRing<()>) -> (String, usize) {
        let key = "k".to_owned();
        let owner = p.owner(&key, 0).unwrap();
        (key, owner)
    }

    #[test]
    fn a_mark_until_a_time_runs_out_then() {
        let p = peers(3);
        let (key, owner) = key_owned_by_one(&p);
        assert_eq!(p.mark(owner, 1_000), UP);
        assert!(!p.up(owner, 999));
        assert!(p.up(owner, 1_000));
        let next = p.owner(&key, 999).unwrap();
        assert_ne!(next, owner);
        assert_eq!(p.owner(&key, 1_000), Some(owner));
    }

    #[test]
    fn a_mark_until_cleared_holds_at_any_time_until_cleared() {
        let p = peers(3);
        let (key, owner) = key_owned_by_one(&p);
        assert_eq!(p.mark(owner, UNTIL_CLEARED), UP);
        assert!(!p.up(owner, 0) && !p.up(owner, u64::MAX - 1));
        assert_ne!(p.owner(&key, u64::MAX - 1), Some(owner));
        assert_eq!(p.mark(owner, UP), UNTIL_CLEARED);
        assert!(p.up(owner, 0));
        assert_eq!(p.owner(&key, 0), Some(owner));
    }

    #[test]
    fn no_owner_when_every_peer_is_down() {
        let p = peers(2);
        for i in 0..2 {
            p.mark(i, UNTIL_CLEARED);
        }
        assert_eq!(p.owner("k", 5), None);
    }
}
