//! A node joining the ring, and one that restarts: the keys that move to it were being counted
//! by another node, their owner on the ring without it (the **previous owner**), until every
//! peer routes them here. Counting them here from 0 would let a window admit the limit twice.
//!
//! So one counter counts each window. Until the join **settles** (every peer routes this node's
//! keys to it), this node **relays** the hits of the keys it owns to their previous owner,
//! which applies them ([`Relay::Apply`]): the peers that do not know of this node yet add to
//! that same counter. From then on nobody adds to the previous owner's counter, so this node
//! **takes it over**: a key's first hit here asks the previous owner for its state of the
//! counter ([`Relay::Take`], one call), merges it into its own, and counts on from it. A key
//! whose counter's horizon (the window's start for a fixed window; the previous window's start
//! for a sliding one, whose estimate weighs it; `now - burst time` for a bucket) begins after
//! the join settled needs neither: nothing counted elsewhere matters to it. Nor does one this
//! node holds already (it took it over). Concurrency limits are not relayed: their slots stay
//! where they were taken, as a request's start and its end's refund must meet.
//!
//! **Settled**: with PEERS, every peer probes this node every 500 ms and routes to it from its
//! first answered probe (a peer that never marked it down routes to it already), so one probe
//! interval after this node started; [`SETTLE_MARGIN`] doubles that for a late probe. With
//! PEERS_DNS, the peers learn of this node when their re-resolution (every 5 s) first lists it:
//! [`DNS_SETTLE`] after this node's own resolution first lists its own address, and never while
//! it is not listed (the peers then route its keys elsewhere, and it relays all of them).
//!
//! The previous owner answers a relayed hit whatever its own ring says (the hit says it was
//! relayed, and such a hit is never relayed again), so a hit takes at most two hops. Relays go
//! out on a client of their own per peer, never in the queue of this node's forwards: a
//! forward waits at its owner on that owner's relays, so relays queued behind forwards could
//! wait on one another around the ring until a deadline broke the cycle (issue 49: every key's
//! first hit of the hour relayed after a start, live peers marked down). When the previous
//! owner cannot be reached (a refused connection, a wrong answer), this node marks it down and
//! counts the hits itself: the owner-change bound of docs/cluster.md applies (that owner's
//! count is lost). A relay that is only late marks nothing down and refuses its charges, never
//! over the limit. A take's counter is forgotten by the previous owner once handed over (a
//! take whose answer came too late loses it: the owner-change bound).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::Timestamp;
use crate::limiter::{CounterKind, Quota};

/// How long after this node starts every peer listed in PEERS routes its keys to it: two of
/// the peers' probe intervals (500 ms), one for the probe to come and one of margin.
pub(crate) const SETTLE_MARGIN: Duration = Duration::from_millis(1_000);

/// How long after this node's own PEERS_DNS answer first lists it every peer's does: one
/// re-resolution interval (5 s), plus [`SETTLE_MARGIN`].
pub const DNS_SETTLE: Duration = Duration::from_millis(6_000);

/// How a hit reaches the node that answers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Relay {
    /// Sent to the key's owner (or its stand-in), which may relay it.
    #[default]
    No,
    /// Relayed to the previous owner before the join settled: applied there.
    Apply,
    /// Relayed after the join settled: not applied there; the previous owner answers its state
    /// of the counter, and the newcomer counts on from it.
    Take,
}

/// When this node's join settled, and which counters it relays meanwhile.
#[derive(Debug)]
pub struct Joining {
    /// µs since the epoch; `u64::MAX` while not known (PEERS_DNS does not list this node).
    settled_us: AtomicU64,
}

impl Joining {
    /// A node listed in PEERS, started at `start`.
    pub fn listed_at_start(start: Timestamp) -> Self {
        Joining {
            settled_us: AtomicU64::new(after(start, SETTLE_MARGIN)),
        }
    }

    /// A node of PEERS_DNS, which does not know yet whether the peers list it.
    pub fn awaiting_dns() -> Self {
        Joining {
            settled_us: AtomicU64::new(u64::MAX),
        }
    }

    /// A PEERS_DNS answer at `now` lists this node (`listed`) or not. The first answer that
    /// lists it sets the settling time; one that does not means the peers route its keys
    /// elsewhere again, until a later answer lists it.
    pub fn resolved(&self, listed: bool, now: Timestamp) {
        if listed {
            let at = after(now, DNS_SETTLE);
            let _ =
                self.settled_us
                    .compare_exchange(u64::MAX, at, Ordering::SeqCst, Ordering::SeqCst);
        } else {
            self.settled_us.store(u64::MAX, Ordering::SeqCst);
        }
    }

    /// When the join settled (or will); `None` while PEERS_DNS does not list this node.
    pub fn settled(&self) -> Option<Timestamp> {
        let us = self.settled_us.load(Ordering::Relaxed);
        (us != u64::MAX).then(|| Timestamp::from_micros(us))
    }

    /// Whether a hit on a counter of `quota` at `now` goes to the key's previous owner, and
    /// how: not once the counter's horizon begins after the join settled (nothing counted
    /// elsewhere matters to it); before the join settled, applied there (the peers may still be
    /// adding to that count); after, to take the counter over. Concurrency limits never (their
    /// slots stay where they were taken).
    ///
    /// A limit with a penalty (`penalty_seconds`) is relayed until its penalty's length too has
    /// passed since the join settled: a penalty the previous owner started before then is
    /// handed over with the take.
    pub fn relay(&self, quota: &Quota, now: Timestamp) -> Option<Relay> {
        let settled = self.settled_us.load(Ordering::Relaxed);
        let (start, _) = CounterKind::of_quota(quota)?.horizon(quota, now)?;
        let start = match quota.penalty {
            Some(p) => start.micros().min(
                now.micros()
                    .saturating_sub(u64::from(p.secs.get()) * 1_000_000),
            ),
            None => start.micros(),
        };
        if start >= settled {
            None
        } else if now.micros() < settled {
            Some(Relay::Apply)
        } else {
            Some(Relay::Take)
        }
    }
}

/// `at + d` in µs since the epoch, short of the "not known" mark.
fn after(at: Timestamp, d: Duration) -> u64 {
    let d = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    at.micros().saturating_add(d).min(u64::MAX - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, Unit};

    /// 10 s into a minute: the next begins at `START + 50`.
    const START: u64 = 1_699_999_990;

    fn relays(j: &Joining, quota: &Quota, now: Timestamp) -> bool {
        j.relay(quota, now).is_some()
    }

    fn at(secs: u64, ms: u64) -> Timestamp {
        Timestamp::from_micros(secs * 1_000_000 + ms * 1_000)
    }

    #[test]
    fn a_fixed_window_begun_before_the_join_settled_is_relayed_until_it_ends() {
        let j = Joining::listed_at_start(at(START, 0));
        let minute = Quota::fixed(20, Unit::Minute);
        // The window of the join, to its last microsecond.
        assert!(relays(&j, &minute, at(START, 0)));
        assert!(relays(&j, &minute, at(START + 49, 999)));
        // Applied there until the join settles, then taken over.
        assert_eq!(j.relay(&minute, at(START, 999)), Some(Relay::Apply));
        assert_eq!(j.relay(&minute, at(START + 1, 0)), Some(Relay::Take));
        // The next window began after the join settled (START + 1 s).
        assert!(!relays(&j, &minute, at(START + 50, 0)));
        // A one-second window: relayed in the second of the join; the next begins as the join
        // settles, and is counted here.
        let second = Quota::fixed(20, Unit::Second);
        assert!(relays(&j, &second, at(START, 999)));
        assert!(!relays(&j, &second, at(START + 1, 0)));
    }

    /// A limit with a penalty: relayed until its penalty's length has passed since the join
    /// settled (START + 1 s), whatever its window, so that a take brings the penalty over.
    #[test]
    fn a_limit_with_a_penalty_is_relayed_for_as_long_as_a_penalty_lasts() {
        let j = Joining::listed_at_start(at(START, 0));
        let second = Quota {
            penalty: Some(crate::limiter::Penalty {
                secs: std::num::NonZeroU32::new(3).unwrap(),
                extends: false,
            }),
            ..Quota::fixed(3, Unit::Second)
        };
        assert_eq!(j.relay(&second, at(START, 999)), Some(Relay::Apply));
        assert_eq!(j.relay(&second, at(START + 1, 0)), Some(Relay::Take));
        assert_eq!(j.relay(&second, at(START + 3, 999)), Some(Relay::Take));
        assert_eq!(j.relay(&second, at(START + 4, 0)), None);
    }

    #[test]
    fn a_sliding_window_is_relayed_one_window_longer_and_a_bucket_for_its_burst_time() {
        let j = Joining::listed_at_start(at(START, 0));
        let sliding = Quota {
            algorithm: Algorithm::SlidingWindow,
            ..Quota::fixed(20, Unit::Minute)
        };
        // The next window's estimate weighs the window of the join.
        assert!(relays(&j, &sliding, at(START + 50, 0)));
        assert!(relays(&j, &sliding, at(START + 109, 999)));
        assert!(!relays(&j, &sliding, at(START + 110, 0)));
        // A bucket of 20 a minute fills in a minute: relayed until a minute after settling.
        let bucket = Quota {
            algorithm: Algorithm::TokenBucket,
            ..Quota::fixed(20, Unit::Minute)
        };
        assert!(relays(&j, &bucket, at(START + 60, 999)));
        assert!(!relays(&j, &bucket, at(START + 61, 1)));
        let slots = Quota {
            algorithm: Algorithm::Concurrency,
            ..Quota::fixed(20, Unit::Minute)
        };
        assert!(
            !relays(&j, &slots, at(START, 0)),
            "slots stay where they are"
        );
    }

    /// What a previous owner hands over is its counter, window by window: the state rebuilt
    /// from its parts decides as the original does.
    #[test]
    fn a_counter_handed_over_in_parts_decides_as_the_original() {
        let now = at(START + 30, 250);
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket,
        ] {
            let quota = Quota {
                algorithm,
                ..Quota::fixed(20, Unit::Minute)
            };
            let kind = CounterKind::of_quota(&quota).unwrap();
            // Some hits in the window before (a sliding window weighs them) and in this one.
            let (_, state) = crate::limiter::counter::decide(&quota, 0, at(START - 20, 0), 7);
            let (_, state) = crate::limiter::counter::decide(&quota, state, now, 5);
            let (window, values) = kind.parts(state, now);
            let rebuilt = kind
                .from_parts(window, &values, now)
                .expect("it holds a count");
            let later = at(START + 40, 0);
            assert_eq!(
                crate::limiter::counter::decide(&quota, rebuilt, later, 3).0,
                crate::limiter::counter::decide(&quota, state, later, 3).0,
                "{algorithm:?}"
            );
        }
        // A counter at rest hands over nothing.
        let fixed = CounterKind::of_quota(&Quota::fixed(20, Unit::Minute)).unwrap();
        let (window, values) = fixed.parts(0, now);
        assert_eq!(fixed.from_parts(window, &values, now), None);
    }

    #[test]
    fn with_peers_dns_the_join_settles_a_resolution_after_this_node_is_first_listed() {
        let j = Joining::awaiting_dns();
        let minute = Quota::fixed(20, Unit::Minute);
        assert_eq!(j.settled(), None);
        // Not listed: the peers route its keys elsewhere, so everything it owns is relayed.
        j.resolved(false, at(START, 0));
        assert!(relays(&j, &minute, at(START + 3_600, 0)));
        j.resolved(true, at(START, 0));
        assert_eq!(j.settled(), Some(at(START + 6, 0)));
        // Later answers that list it change nothing.
        j.resolved(true, at(START + 5, 0));
        assert_eq!(j.settled(), Some(at(START + 6, 0)));
        assert!(!relays(&j, &minute, at(START + 50, 0)));
        // Dropped from the answers, then listed again: a new join.
        j.resolved(false, at(START + 100, 0));
        assert_eq!(j.settled(), None);
        j.resolved(true, at(START + 105, 0));
        assert_eq!(j.settled(), Some(at(START + 111, 0)));
        // The window that began at START + 110, a second before it settled, is relayed.
        assert!(relays(&j, &minute, at(START + 160, 0)));
        assert!(!relays(&j, &minute, at(START + 170, 0)));
    }
}
