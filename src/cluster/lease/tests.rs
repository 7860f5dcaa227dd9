//! Lease mode's logic without a network: nodes (each a map of [`Held`]) and one
//! [`LeaseServer`], driven by a manual time, with asks answered at once or lost.

use std::collections::HashMap;
use std::num::NonZeroU32;

use proptest::prelude::*;

use super::client::{Held, Local};
use super::server::{Ask, Capacity, LeaseServer, LeaseTiming, PPM};
use crate::clock::Timestamp;
use crate::limiter::{Algorithm, Quota, Unit};

const S: u64 = 1_000_000;
const T0: u64 = 1_700_000_000 * S;
const TIMING: LeaseTiming = LeaseTiming::DEFAULT;

fn quota(algorithm: Algorithm, limit: u32, unit: Unit, burst: u32) -> Quota {
    Quota {
        penalty: None,
        safe_capacity: None,
        requests_per_unit: limit,
        unit,
        algorithm,
        burst: NonZeroU32::new(burst),
        charge_refused: false,
        unit_multiplier: 1,
        calendar: crate::limiter::Calendar::EPOCH,
    }
}

/// A node's first ask about a key of `q` at T0: nothing used or held, `want` hits now, a
/// demand of `demand_milli`.
fn first_ask(q: Quota, want: u64, demand_milli: u64) -> Ask {
    Ask {
        quota: q,
        epoch: super::window::epoch_of(&q, T0),
        used: 0,
        keep: 0,
        want,
        demand_milli,
        horizon_us: 0,
    }
}

/// `nodes` nodes holding leases on one key from one server, with the server's ring changes
/// last seen long ago (no rebuild) unless `since` says otherwise.
struct Cluster {
    server: LeaseServer,
    held: Vec<Option<Held>>,
    /// The quota a sliding window's estimate is checked against.
    quota: Quota,
    /// The quota each node's hits carry (its config): `quota` unless a test reloads a node.
    quotas: Vec<Quota>,
    last_change: u64,
    admitted: HashMap<u64, u64>,
    /// Whether the next answer is lost (the node keeps what it holds).
    lose: bool,
    /// Acquires sent.
    acquires: u64,
    /// What the owner may hand out per window (a tree's child: its parent's grant).
    capacity: Capacity,
}

impl Cluster {
    fn new(nodes: usize, quota: Quota) -> Self {
        Cluster {
            server: LeaseServer::new(TIMING),
            held: (0..nodes).map(|_| None).collect(),
            quota,
            quotas: vec![quota; nodes],
            last_change: 0,
            admitted: HashMap::new(),
            lose: false,
            acquires: 0,
            capacity: Capacity::default(),
        }
    }

    fn node_name(n: usize) -> String {
        format!("10.0.0.{n}:8082")
    }

    fn ask(&mut self, node: usize, ask: &Ask, now: u64) {
        let grant = self.server.answer_within(
            &Self::node_name(node),
            "k",
            ask,
            self.capacity,
            Timestamp::from_micros(now),
            Timestamp::from_micros(self.last_change),
            self.held.len(),
        );
        let held = self.held[node].as_mut().expect("held");
        if self.lose {
            held.failed();
        } else {
            held.grant(&grant, now);
        }
    }

    /// One hit on `node` at `now`; whether it was admitted.
    fn hit(&mut self, node: usize, now: u64) -> bool {
        let quota = self.quota;
        let live = self.held.len() as u64;
        let asked = self.quotas[node];
        // As `LeaseClient::route` does when a hit's quota changed: the same counter under
        // another limit keeps what is held, another counter starts a fresh lease.
        if let Some(held) = &mut self.held[node]
            && *held.quota() != asked
            && !held.requota(asked, now)
        {
            self.held[node] = None;
        }
        let held = self.held[node].get_or_insert_with(|| Held::new(asked, now, live));
        let admitted =
            match held.decide(now, 1, crate::cluster::lease::window::micros(TIMING.renew)) {
                Local::Decided(d) => !d.over,
                Local::Wait => false,
                Local::Acquire(ask) => {
                    self.acquires += 1;
                    self.ask(node, &ask, now);
                    let held = self.held[node].as_mut().expect("held");
                    !held.decide_after_acquire(now, 1).over
                }
            };
        if admitted {
            let window = now / S / quota.window().secs();
            *self.admitted.entry(window).or_default() += 1;
            if quota.algorithm == Algorithm::SlidingWindow {
                // The sliding estimate over what the whole cluster admitted never passes the
                // limit: previous x (1 - elapsed fraction) + current.
                let unit_us = quota.window().secs() * S;
                let previous = self.admitted.get(&(window - 1)).copied().unwrap_or(0);
                let current = self.admitted[&window];
                let left = unit_us - now % unit_us;
                let estimate = u128::from(previous) * u128::from(left)
                    + u128::from(current) * u128::from(unit_us);
                assert!(
                    estimate <= u128::from(quota.requests_per_unit) * u128::from(unit_us),
                    "sliding estimate {previous} x {left}/{unit_us} + {current} over the limit"
                );
            }
        }
        admitted
    }

    fn renew(&mut self, node: usize, now: u64) {
        let Some(held) = self.held[node].as_mut() else {
            return;
        };
        if let Some(ask) = held.renewal(now, 0, &TIMING) {
            self.ask(node, &ask, now);
        }
    }

    fn renew_all(&mut self, now: u64) {
        for n in 0..self.held.len() {
            self.renew(n, now);
        }
    }
}

#[test]
fn a_window_admits_its_limit_over_nodes_and_no_more() {
    let q = quota(Algorithm::FixedWindow, 100, Unit::Second, 0);
    let mut c = Cluster::new(3, q);
    // Each node offered 100 hits per second (3x the limit), spread over the second; renewals
    // every 100 ms.
    for second in 0..5u64 {
        for step in 0..100u64 {
            let now = T0 + second * S + step * 10_000;
            if step % 10 == 0 {
                c.renew_all(now);
            }
            for n in 0..3 {
                c.hit(n, now);
            }
        }
    }
    for (window, admitted) in &c.admitted {
        assert!(*admitted <= 100, "window {window} admitted {admitted}");
    }
    // After the first window (cold: demand unknown) the limit is used nearly in full.
    let steady: Vec<u64> = (1..5).map(|s| c.admitted[&((T0 + s * S) / S)]).collect();
    assert!(steady.iter().all(|&a| a >= 95), "utilisation {steady:?}");
}

#[test]
fn an_over_limit_key_stops_acquiring_once_the_owner_has_nothing_more() {
    let q = quota(Algorithm::FixedWindow, 30, Unit::Second, 0);
    let mut c = Cluster::new(3, q);
    // Each node offered 100 hits per second (10x its share), renewals every 100 ms: every
    // allowance is used up early in each window, and an acquire then brings nothing more.
    let mut late_acquires = 0;
    for second in 0..5u64 {
        for step in 0..100u64 {
            let now = T0 + second * S + step * 10_000;
            if step % 10 == 0 {
                c.renew_all(now);
            }
            let before = c.acquires;
            for n in 0..3 {
                c.hit(n, now);
            }
            if second > 0 {
                late_acquires += c.acquires - before;
            }
        }
    }
    // Fruitless acquires back off (25 ms, 50 ms, 100 ms, ...), so a node sends at most about
    // 1 + log2(window / 25 ms) of them in a window, here 7 (one per hit would be 100 each),
    // and the limit is still used in full.
    assert!(late_acquires <= 3 * 4 * 7, "{late_acquires} acquires");
    for s in 1..5u64 {
        let admitted = c.admitted[&((T0 + s * S) / S)];
        assert!((28..=30).contains(&admitted), "window {s}: {admitted}");
    }
}

/// A burst of `offered[n]` hits on node `n`, all in the first `within_us` of the window at
/// `start` (interleaved evenly, renewals every 100 ms): what each node admitted.
fn burst(c: &mut Cluster, start: u64, offered: &[u64], within_us: u64) -> Vec<u64> {
    let total: u64 = offered.iter().sum();
    let mut admitted = vec![0; offered.len()];
    let mut sent = vec![0; offered.len()];
    let mut renewed_at = start;
    for i in 0..total {
        let now = start + i * within_us / total;
        if now >= renewed_at + 100_000 {
            c.renew_all(now);
            renewed_at = now;
        }
        // The node furthest behind its share of the burst so far sends the next hit.
        let n = (0..offered.len())
            .filter(|&n| sent[n] < offered[n])
            .min_by_key(|&n| sent[n] * total / offered[n])
            .expect("hits left");
        sent[n] += 1;
        admitted[n] += u64::from(c.hit(n, now));
    }
    admitted
}

#[test]
fn a_burst_on_one_node_gets_what_the_others_leave_within_the_burst() {
    // Issue 34's scenario: 600 a minute over three nodes, three times that offered in the
    // window's first moments, 90% of it to node 0.
    let q = quota(Algorithm::FixedWindow, 600, Unit::Minute, 0);
    for within_us in [100_000, 500_000, 2_000_000] {
        let mut c = Cluster::new(3, q);
        let start = (T0 / (60 * S) + 1) * 60 * S;
        let admitted = burst(&mut c, start, &[1620, 90, 90], within_us);
        let total: u64 = admitted.iter().sum();
        assert!(
            (570..=600).contains(&total),
            "burst over {within_us} us: {admitted:?}"
        );
    }
}

#[test]
fn a_burst_does_not_take_what_a_steady_node_keeps_using() {
    // Nodes 1 and 2 are asked 2/s all along (240 of 600 a minute); node 0, quiet until now,
    // sends a burst of 1,000 at the start of the next minute: it gets what the steady nodes
    // do not need, and they go on being admitted for the rest of the minute.
    let q = quota(Algorithm::FixedWindow, 600, Unit::Minute, 0);
    let mut c = Cluster::new(3, q);
    let minute = 60 * S;
    let start = (T0 / minute + 1) * minute;
    for step in 0..600u64 {
        let now = start + step * 100_000;
        c.renew_all(now);
        if step % 5 == 0 {
            c.hit(1, now);
            c.hit(2, now);
        }
    }
    let next = start + minute;
    let mut steady = 0;
    let mut burst_admitted = 0;
    for step in 0..600u64 {
        let now = next + step * 100_000;
        c.renew_all(now);
        if step < 2 {
            for _ in 0..500 {
                burst_admitted += u64::from(c.hit(0, now));
            }
        }
        if step % 5 == 0 {
            steady += u64::from(c.hit(1, now)) + u64::from(c.hit(2, now));
        }
    }
    assert!(c.admitted[&(next / S / 60)] <= 600);
    assert!(
        steady >= 230,
        "the steady nodes keep their pace: {steady} of 240"
    );
    assert!(
        burst_admitted >= 330,
        "the burst gets the rest: {burst_admitted} of 360"
    );
}

#[test]
fn a_node_that_stops_asking_gives_its_share_to_the_others() {
    let q = quota(Algorithm::FixedWindow, 1000, Unit::Minute, 0);
    let mut c = Cluster::new(2, q);
    let start = (T0 / (60 * S)) * 60 * S;
    // Both nodes are asked 20/s, node 1 for the first 10 s only: 1,400 asked of 1,000.
    let mut late = 0;
    for step in 0..600u64 {
        let now = start + step * 100_000;
        c.renew_all(now);
        for _ in 0..2 {
            let a = c.hit(0, now);
            if step >= 100 && a {
                late += 1;
            }
            if step < 100 {
                c.hit(1, now);
            }
        }
    }
    let total = c.admitted[&(start / S / 60)];
    assert!(total <= 1000);
    assert!(total >= 990, "the limit is used: {total}");
    // Node 1 used 200; its unused half of the split went to node 0 once it stopped.
    assert!(late >= 590, "node 0 got node 1's share: {late}");
}

#[test]
fn fair_share_splits_a_hot_key_by_demand() {
    let q = quota(Algorithm::FixedWindow, 100, Unit::Second, 0);
    let mut c = Cluster::new(2, q);
    let (mut a, mut b) = (0, 0);
    // Node 0 is asked 500/s, node 1 only 20/s, over 10 s of a 100/s limit: node 1 gets all it
    // asks (max-min), node 0 the rest.
    for step in 0..1000u64 {
        let now = T0 + step * 10_000;
        if step % 10 == 0 {
            c.renew_all(now);
        }
        for _ in 0..5 {
            a += u64::from(c.hit(0, now));
        }
        if step % 5 == 0 {
            b += u64::from(c.hit(1, now));
        }
    }
    assert!(c.admitted.values().all(|&w| w <= 100));
    assert!(b >= 180, "the small demand is met: {b} of 200");
    assert!(a + b >= 950, "the limit is used: {} of 1000", a + b);
}

#[test]
fn the_next_window_is_granted_ahead_so_a_boundary_needs_no_call() {
    let q = quota(Algorithm::FixedWindow, 100, Unit::Second, 0);
    let mut c = Cluster::new(1, q);
    let start = T0;
    for step in 0..10u64 {
        let now = start + step * 100_000;
        c.renew_all(now);
        c.hit(0, now);
    }
    // 950 ms in: the last renewal of the window granted the next one ahead.
    c.renew_all(start + 950_000);
    let held = c.held[0].as_mut().expect("held");
    match held.decide(start + S + 1, 1, 100_000) {
        Local::Decided(d) => assert!(!d.over),
        other => panic!("expected a local decision at the boundary, got {other:?}"),
    }
}

#[test]
fn lost_answers_never_let_a_window_pass_its_limit() {
    let q = quota(Algorithm::FixedWindow, 50, Unit::Second, 0);
    let mut c = Cluster::new(3, q);
    for step in 0..300u64 {
        let now = T0 + step * 10_000;
        c.lose = step % 7 == 3;
        if step % 10 == 0 {
            c.renew_all(now);
        }
        for n in 0..3 {
            c.hit(n, now);
        }
    }
    assert!(c.admitted.values().all(|&a| a <= 50), "{:?}", c.admitted);
}

#[test]
fn a_rebuilding_owner_grants_each_node_an_equal_share_at_most() {
    let q = quota(Algorithm::FixedWindow, 90, Unit::Minute, 0);
    let mut c = Cluster::new(3, q);
    let now = T0;
    c.last_change = now - 100_000;
    for _ in 0..200 {
        c.hit(0, now);
    }
    let (_, allowance, _) = c.held[0].as_ref().expect("held").holding();
    assert!(
        allowance <= 30,
        "capped at 90 / 3 while rebuilding: {allowance}"
    );
}

#[test]
fn a_rebuilding_owner_takes_what_nodes_report_holding() {
    let q = quota(Algorithm::FixedWindow, 100, Unit::Minute, 0);
    let server = LeaseServer::new(TIMING);
    let now = Timestamp::from_micros(T0);
    let report = Ask {
        quota: q,
        epoch: super::window::window_index(&q, T0),
        used: 60,
        keep: 70,
        want: 0,
        demand_milli: 0,
        horizon_us: 0,
    };
    let g = server.answer("a", "k", &report, now, now, 2);
    assert_eq!(g.allowance, 70, "what the node holds from the old owner");
    let newcomer = Ask {
        used: 0,
        keep: 0,
        want: 50,
        demand_milli: 100_000,
        ..report
    };
    let g = server.answer("b", "k", &newcomer, now, now, 2);
    assert!(g.allowance <= 30, "only what is left: {}", g.allowance);
}

#[test]
fn bucket_shares_never_sum_past_the_whole() {
    let q = quota(Algorithm::TokenBucket, 100, Unit::Second, 100);
    let server = LeaseServer::new(TIMING);
    let now = Timestamp::from_micros(T0);
    let mut total = 0;
    for n in 0..5 {
        let ask = first_ask(q, 1, 100_000);
        total += server
            .answer(&n.to_string(), "k", &ask, now, Timestamp::from_micros(0), 5)
            .allowance;
    }
    assert!(total <= PPM, "{total}");
    assert!(
        total >= PPM * 9 / 10,
        "the rate is given out when asked for: {total}"
    );
}

#[test]
fn a_bucket_admits_its_rate_over_nodes() {
    let q = quota(Algorithm::TokenBucket, 100, Unit::Second, 10);
    let mut c = Cluster::new(3, q);
    let mut admitted = 0u64;
    // 10 s, each node offered 100/s (3x the rate).
    for step in 0..1000u64 {
        let now = T0 + step * 10_000;
        if step % 10 == 0 {
            c.renew_all(now);
        }
        for n in 0..3 {
            admitted += u64::from(c.hit(n, now));
        }
    }
    // At most capacity + rate x time, plus one bucket's worth per share change.
    assert!(admitted <= 10 + 100 * 10 + 30, "admitted {admitted}");
    assert!(admitted >= 900, "utilisation: {admitted} of 1010");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn no_window_ever_admits_more_than_its_limit(
        limit in 1u32..200,
        nodes in 1usize..6,
        sliding in any::<bool>(),
        traffic in proptest::collection::vec((0usize..6, 0u64..20_000, 1u64..4), 1..400),
        lost in proptest::collection::vec(any::<bool>(), 64),
    ) {
        let algorithm = if sliding { Algorithm::SlidingWindow } else { Algorithm::FixedWindow };
        let q = quota(algorithm, limit, Unit::Second, 0);
        let mut c = Cluster::new(nodes, q);
        let mut now = T0;
        for (i, (node, gap, n)) in traffic.into_iter().enumerate() {
            now += gap * 100;
            c.lose = lost[i % lost.len()];
            if i % 5 == 0 {
                c.renew_all(now);
            }
            for _ in 0..n {
                c.hit(node % nodes, now);
            }
        }
        for (w, a) in &c.admitted {
            prop_assert!(*a <= u64::from(limit), "window {} admitted {} of {}", w, a, limit);
        }
    }
}

#[test]
fn an_owner_counts_what_a_node_holds_from_another_owner_when_the_key_comes_back() {
    let q = quota(Algorithm::FixedWindow, 100, Unit::Minute, 0);
    let server = LeaseServer::new(TIMING);
    let now = Timestamp::from_micros(T0);
    let old = Timestamp::from_micros(0);
    let ask = first_ask(q, 10, 0);
    let first = server.answer("a", "k", &ask, now, old, 2);
    assert!(first.allowance >= 10);
    // Meanwhile another owner granted node a up to 60 (it believed this one down); back here,
    // a reports holding 60: this server counts 60, so b gets at most the remaining 40.
    let back = Ask {
        keep: 60,
        used: 50,
        want: 0,
        ..ask
    };
    assert_eq!(server.answer("a", "k", &back, now, old, 2).allowance, 60);
    let b = Ask {
        want: 100,
        demand_milli: 1_000_000,
        ..ask
    };
    let g = server.answer("b", "k", &b, now, old, 2);
    assert!(g.allowance <= 40, "b got {}", g.allowance);
}

#[test]
fn an_expired_holder_keeps_its_allowance_charged_and_a_flood_of_names_is_bounded() {
    let q = quota(Algorithm::FixedWindow, 2000, Unit::Hour, 0);
    let server = LeaseServer::new(TIMING);
    let t = |us: u64| Timestamp::from_micros(T0 + us);
    let old = Timestamp::from_micros(0);
    let ask = first_ask(q, 1, 0);
    let mut granted = 0;
    for n in 0..1500 {
        granted += server
            .answer(&format!("n{n}"), "k", &ask, t(0), old, 3)
            .allowance;
    }
    assert_eq!(
        granted, 1024,
        "one each for the first 1024 names, nothing past the bound"
    );
    // Every lease expired: their allowances stay charged, so a new node gets the rest only.
    let late = Ask { want: 2000, ..ask };
    let g = server.answer("late", "k", &late, t(2 * S), old, 3);
    assert_eq!(g.allowance, 2000 - 1024);
}

#[test]
fn a_node_asking_again_after_its_lease_expired_is_charged_once() {
    let q = quota(Algorithm::FixedWindow, 10, Unit::Hour, 0);
    let server = LeaseServer::new(TIMING);
    let t = |us: u64| Timestamp::from_micros(T0 + us);
    let old = Timestamp::from_micros(0);
    let ask = first_ask(q, 4, 0);
    assert_eq!(server.answer("a", "k", &ask, t(0), old, 2).allowance, 4);
    // Node a used its 4 and said nothing for longer than a lease: its lease expired. It asks
    // again in the same window, reporting the 4 it holds and used.
    let again = Ask {
        used: 4,
        keep: 4,
        want: 1,
        ..ask
    };
    assert_eq!(
        server.answer("a", "k", &again, t(2 * S), old, 2).allowance,
        5
    );
    // Its 4 are charged once: the other node gets the other 5.
    let b = Ask { want: 10, ..ask };
    assert_eq!(server.answer("b", "k", &b, t(2 * S), old, 2).allowance, 5);
}

#[test]
fn an_owner_keeps_within_its_bytes_and_refuses_a_lease_past_them() {
    let q = quota(Algorithm::FixedWindow, 10, Unit::Hour, 0);
    // Room for five keys of two bytes with one holder of one byte each.
    let one = super::server::KEY_CHARGE + 2 + super::server::HOLDER_CHARGE + 1;
    let timing = LeaseTiming {
        max_bytes: 5 * one,
        ..TIMING
    };
    let server = LeaseServer::new(timing);
    let now = Timestamp::from_micros(T0);
    let ask = first_ask(q, 1, 0);
    // Each key is charged its bytes and its one holder's: five keys fill the budget.
    let leased = (0..8)
        .filter(|k| {
            server
                .answer(
                    "a",
                    &format!("k{k}"),
                    &ask,
                    now,
                    Timestamp::from_micros(0),
                    1,
                )
                .leased
        })
        .count();
    assert_eq!(leased, 5);
    assert_eq!(server.bytes(), 5 * one);
    // A known key still answers its holder; a new holder of it gets nothing.
    assert!(server.answer("a", "k0", &ask, now, now, 1).allowance >= 1);
    assert_eq!(server.answer("b", "k0", &ask, now, now, 1).allowance, 0);
    // Once the leases expire and the hour is over, the sweep frees every record.
    server.sweep(Timestamp::from_micros(T0 + 3_600 * S));
    assert_eq!((server.len(), server.bytes()), (0, 0));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Buckets: in any run, what the nodes admit is at most the key's capacity, its rate over
    /// the run, and one full share per node (a node's first grant starts its bucket full).
    #[test]
    fn buckets_admit_their_rate_and_capacity_over_nodes(
        rate in 1u32..50,
        burst in 1u32..20,
        nodes in 1usize..6,
        leaky in any::<bool>(),
        traffic in proptest::collection::vec((0usize..6, 0u64..2_000, 1u64..4), 1..600),
        lost in proptest::collection::vec(any::<bool>(), 64),
    ) {
        let algorithm = if leaky { Algorithm::LeakyBucket } else { Algorithm::TokenBucket };
        let q = quota(algorithm, rate, Unit::Second, burst);
        let mut c = Cluster::new(nodes, q);
        let mut now = T0;
        let mut admitted = 0u64;
        for (i, (node, gap, n)) in traffic.into_iter().enumerate() {
            now += gap * 100;
            c.lose = lost[i % lost.len()];
            if i % 5 == 0 {
                c.renew_all(now);
            }
            for _ in 0..n {
                admitted += u64::from(c.hit(node % nodes, now));
            }
        }
        let elapsed_s = (now - T0).div_ceil(S);
        let capacity = u64::from(burst) + 1;
        let bound = capacity * (1 + nodes as u64) + u64::from(rate) * elapsed_s;
        prop_assert!(admitted <= bound, "admitted {} over {} s, bound {}", admitted, elapsed_s, bound);
    }
}

#[test]
fn equal_demands_split_what_is_left_of_a_window_whoever_asked_first() {
    let q = quota(Algorithm::FixedWindow, 1000, Unit::Hour, 0);
    let mut c = Cluster::new(2, q);
    let start = (T0 / (3_600 * S)) * 3_600 * S;
    // Node 0 alone for 2 s at 100/s, then both at 100/s: equal demand, so once node 1 asks,
    // renewals bring them to equal parts of what is left, whoever asked first.
    let (mut a, mut b) = (0u64, 0u64);
    for step in 0..200u64 {
        let now = start + step * 100_000;
        c.renew_all(now);
        for _ in 0..10 {
            a += u64::from(c.hit(0, now));
            if step >= 20 {
                b += u64::from(c.hit(1, now));
            }
        }
    }
    assert!(a + b <= 1000);
    let (_, held_a, used_a) = c.held[0].as_ref().expect("held").holding();
    let (_, held_b, used_b) = c.held[1].as_ref().expect("held").holding();
    assert_eq!((used_a, used_b), (a, b));
    // Node 0 used its 200 alone; what was left, 800, went half and half.
    assert!(
        b >= 350,
        "node 1 got {b} of the 800 left (node 0: {a}); held {held_a}, {held_b}"
    );
}

#[test]
fn a_node_that_asked_first_gives_back_the_bucket_share_past_its_fair_part() {
    let q = quota(Algorithm::TokenBucket, 100, Unit::Second, 10);
    let mut c = Cluster::new(2, q);
    // Node 0 alone for 2 s at 300/s (it gets the whole rate), then both at 300/s: equal demand
    // over the rate, so node 0 gives back half at its renewals and node 1 gets it.
    let (mut a, mut b) = (0u64, 0u64);
    for step in 0..600u64 {
        let now = T0 + step * 10_000;
        if step % 10 == 0 {
            c.renew_all(now);
        }
        for _ in 0..3 {
            let late = step >= 400;
            a += u64::from(c.hit(0, now) && late);
            if step >= 200 {
                b += u64::from(c.hit(1, now) && late);
            }
        }
    }
    // The last 2 s: about 100 each of the 200 the rate allows.
    assert!(a + b <= 200 + 2 * 10 + 5, "{a} + {b}");
    assert!(
        b >= 80 && a >= 80,
        "node 0 {a}, node 1 {b}: the rate split evenly"
    );
}

#[test]
fn a_limit_that_charges_refused_hits_is_never_leased() {
    let client = super::LeaseClient::new(TIMING);
    for algorithm in Algorithm::ALL {
        let charged = Quota {
            charge_refused: true,
            ..quota(algorithm, 100, Unit::Minute, 0)
        };
        let route = client.route("d_k_v_", charged, T0, 40, || 3, || None);
        assert!(matches!(route, super::Route::Forward), "{algorithm:?}");
    }
    assert!(client.is_empty(), "nothing held for such a limit");
    assert_eq!(
        client
            .stats
            .forwarded
            .load(std::sync::atomic::Ordering::Relaxed),
        0,
        "not counted as a full table"
    );
    // The same limit without the setting is leased (the first hit asks its owner).
    let plain = quota(Algorithm::TokenBucket, 100, Unit::Minute, 0);
    assert!(matches!(
        client.route("d_k_v_", plain, T0, 1, || 3, || None),
        super::Route::Acquire(..)
    ));
}

/// Requests in flight counted with refunds (a hit at each request's start, a refund at its end,
/// sent to any node): a refund gives capacity back to the allowance of the node it reaches, so
/// places are used again, and the requests in flight across the cluster never pass the limit
/// (each node's count only overstates its own, and the owner keeps charging each node the most
/// it had in use).
#[test]
fn refunds_reuse_an_allowance_and_never_let_requests_in_flight_pass_the_limit() {
    let q = quota(Algorithm::FixedWindow, 10, Unit::Hour, 0);
    let mut c = Cluster::new(3, q);
    let mut in_flight: Vec<usize> = Vec::new();
    let (mut admitted, mut seed) = (0u64, 7u64);
    let mut next = |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    for step in 0..3000u64 {
        let now = T0 + step * 10_000;
        if step % 10 == 0 {
            c.renew_all(now);
        }
        let node = next(3) as usize;
        if next(2) == 0 || in_flight.is_empty() {
            if c.hit(node, now) {
                admitted += 1;
                in_flight.push(node);
            }
        } else {
            // A request ends: its refund reaches whichever node Envoy picks.
            in_flight.swap_remove(next(in_flight.len() as u64) as usize);
            let held = c.held[node].get_or_insert_with(|| Held::new(q, now, 3));
            let d = held.refund(now, 1);
            assert!(d.reset_after_secs >= 1);
        }
        assert!(
            in_flight.len() <= 10,
            "{} in flight at step {step}",
            in_flight.len()
        );
    }
    // Places were used again and again within one window.
    assert!(admitted > 100, "admitted {admitted}");
}

/// A holder's refund answers a peek: the limit less what the others hold or used and what it
/// has in use; a fixed window's count comes down too (as everywhere), floored at 0.
#[test]
fn a_holder_refund_answers_what_is_left() {
    let q = quota(Algorithm::FixedWindow, 10, Unit::Hour, 0);
    let mut c = Cluster::new(1, q);
    for _ in 0..4 {
        assert!(c.hit(0, T0));
    }
    let held = c.held[0].as_mut().expect("held");
    let d = held.refund(T0, 1);
    assert!(!d.over);
    assert_eq!((d.count_after, d.remaining), (3, 7));
    let d = held.refund(T0, 10);
    assert_eq!((d.count_after, d.remaining), (0, 10));
    assert_eq!(held.holding().2, 0, "used floored at 0");
}

/// What a node admitted alone, without a majority, goes with its next report as used, so an
/// owner it reaches again within the window grants that much less; a new window forgets it.
#[test]
fn what_a_node_admitted_alone_is_reported_as_used_in_its_window() {
    let q = quota(Algorithm::FixedWindow, 300, Unit::Hour, 0);
    let timing = LeaseTiming::DEFAULT;
    let mut held = Held::new(q, T0, 3);
    held.admitted_alone(T0, 40);
    // The safe capacity counts only the lease's part (the memory store holds the 40).
    assert_eq!(held.admit_held(T0, 1).map(|_| ()), Err(0));
    let ask = held
        .renewal(T0 + 1, 1, &timing)
        .expect("a ring change is reported");
    assert_eq!((ask.used, ask.keep), (40, 40));
    held.failed();
    let next_window = T0 + 3_600_000_000;
    let ask = held
        .renewal(next_window, 2, &timing)
        .expect("a ring change is reported");
    assert_eq!(ask.used, 0);
}

/// What the server holds of the key in window `epoch`, over every holder.
fn held_in(server: &LeaseServer, epoch: u64, now: u64) -> u64 {
    let holders = server.holders("k", Timestamp::from_micros(now));
    holders
        .iter()
        .filter(|h| h.epoch == epoch)
        .map(|h| h.allowance)
        .sum()
}

#[test]
fn with_no_capacity_set_an_owner_grants_as_it_did() {
    // The same asks to `answer` and to `answer_within` with no capacity, or one above the
    // limit: acquires and renewals over windows, grants ahead in the last renewals of each.
    let q = quota(Algorithm::FixedWindow, 100, Unit::Second, 0);
    let servers = [
        LeaseServer::new(TIMING),
        LeaseServer::new(TIMING),
        LeaseServer::new(TIMING),
    ];
    let capacities = [
        Capacity::default(),
        Capacity {
            current: Some(1000),
            next: Some(100),
        },
    ];
    for step in 0..300u64 {
        let now = T0 + step * 35_000;
        let node = format!("n{}", step % 3);
        let ask = Ask {
            epoch: super::window::epoch_of(&q, now),
            want: step % 7,
            demand_milli: (step % 3 + 1) * 40_000,
            ..first_ask(q, 0, 0)
        };
        let (at, changed) = (Timestamp::from_micros(now), Timestamp::from_micros(0));
        let before = servers[0].answer(&node, "k", &ask, at, changed, 3);
        for (server, capacity) in servers[1..].iter().zip(capacities) {
            let within = server.answer_within(&node, "k", &ask, capacity, at, changed, 3);
            assert_eq!(within, before, "step {step}, {capacity:?}");
        }
    }
}

#[test]
fn a_capacity_below_the_limit_is_divided_by_demand_and_never_passed() {
    // A limit of 1,000/s of which the owner may hand out 300 (its parent's grant): node 0 is
    // asked 500/s, node 1 100/s. Node 1 gets all it asks (max-min), node 0 the rest of the
    // 300, not of the 1,000.
    let q = quota(Algorithm::FixedWindow, 1000, Unit::Second, 0);
    let mut c = Cluster::new(2, q);
    c.capacity = Capacity {
        current: Some(300),
        next: Some(300),
    };
    let (mut a, mut b) = (0, 0);
    for step in 0..1000u64 {
        let now = T0 + step * 10_000;
        if step % 10 == 0 {
            c.renew_all(now);
        }
        for _ in 0..5 {
            a += u64::from(c.hit(0, now));
        }
        b += u64::from(c.hit(1, now));
        let epoch = now / S;
        assert!(held_in(&c.server, epoch, now) <= 300, "held at {step}");
        assert!(held_in(&c.server, epoch + 1, now) <= 300, "ahead at {step}");
    }
    assert!(c.admitted.values().all(|&w| w <= 300), "{:?}", c.admitted);
    assert!(b >= 900, "the small demand is met: {b} of 1000");
    assert!(a + b >= 2800, "the capacity is used: {} of 3000", a + b);
}

#[test]
fn a_capacity_raised_within_a_window_lets_the_holders_grow_at_their_next_renewal() {
    // Two nodes asked 500/s each against a capacity of 100 of a limit of 1,000; halfway
    // through a window the parent grants 400: within a renewal the nodes hold more, and the
    // window admits more than 100 and at most 400.
    let q = quota(Algorithm::FixedWindow, 1000, Unit::Second, 0);
    let mut c = Cluster::new(2, q);
    c.capacity = Capacity {
        current: Some(100),
        next: Some(100),
    };
    let start = T0 + 2 * S;
    for step in 0..300u64 {
        let now = T0 + step * 10_000;
        if now == start + S / 2 {
            let before = held_in(&c.server, now / S, now);
            assert!(before <= 100, "{before} held under a capacity of 100");
            c.capacity.current = Some(400);
        }
        if now == start + S / 2 + 100_000 {
            let after = held_in(&c.server, now / S, now);
            assert!(after > 200, "{after} held a renewal after the raise");
        }
        if step % 10 == 0 {
            c.renew_all(now);
        }
        for n in 0..2 {
            for _ in 0..5 {
                c.hit(n, now);
            }
        }
    }
    let raised = c.admitted[&(start / S)];
    assert!((300..=400).contains(&raised), "the raised window: {raised}");
    assert!(c.admitted[&(start / S - 1)] <= 100);
}

#[test]
fn a_keys_summary_sums_what_its_holders_used_hold_and_ask_for() {
    // What a child cluster's owner reports to its parent (`super::parent`).
    let q = quota(Algorithm::FixedWindow, 100, Unit::Minute, 0);
    let server = LeaseServer::new(TIMING);
    let now = Timestamp::from_micros(T0);
    let epoch = super::window::window_index(&q, T0);
    let report = |used, keep, demand_milli| Ask {
        used,
        keep,
        ..first_ask(q, 0, demand_milli)
    };
    server.answer(
        "a",
        "k",
        &report(10, 20, 5_000),
        now,
        Timestamp::from_micros(0),
        2,
    );
    server.answer(
        "b",
        "k",
        &report(4, 6, 3_000),
        now,
        Timestamp::from_micros(0),
        2,
    );
    let s = server.summary("k", now).unwrap();
    assert_eq!((s.epoch, s.used), (epoch, 14));
    assert!(s.held >= 26, "{s:?}");
    assert_eq!(s.demand_milli, 8_000);
    // Once b's lease expires, what it held counts as used (it may have used it all) and its
    // demand no longer counts.
    let a_again = Timestamp::from_micros(T0 + TIMING.duration_us() / 2);
    server.answer(
        "a",
        "k",
        &report(10, 20, 5_000),
        a_again,
        Timestamp::from_micros(0),
        2,
    );
    let later = Timestamp::from_micros(T0 + TIMING.duration_us() + 1);
    let held_b = server
        .holders("k", later)
        .iter()
        .find(|h| h.node == "b")
        .map(|h| h.allowance)
        .unwrap();
    let s = server.summary("k", later).unwrap();
    assert_eq!(s.used, 10 + held_b, "{s:?}");
    assert_eq!(s.demand_milli, 5_000);
    assert_eq!(server.summary("other", later), None);
}

#[test]
fn a_rebuilding_owner_caps_its_grants_ahead_too() {
    // Holders it has not heard from may be spending a safe capacity in the next window (a
    // child cluster below a parent that restarted empty): the grant ahead is capped as the
    // current one is, at the limit over the live nodes.
    let q = quota(Algorithm::FixedWindow, 100, Unit::Second, 0);
    let server = LeaseServer::new(TIMING);
    let now = Timestamp::from_micros(T0 + 900_000);
    let ask = Ask {
        epoch: super::window::window_index(&q, now.micros()),
        // 400 a second: 80 over the horizon, within the limit, past an equal share of 50.
        ..first_ask(q, 1, 400_000)
    };
    let g = server.answer("a", "k", &ask, now, now, 2);
    let ahead = g.next_allowance.expect("the next window is granted ahead");
    assert!(ahead > 0 && ahead <= 50, "{g:?}");
    // Once the rebuild is over, the same demand gets more of the next window.
    let later = Timestamp::from_micros(T0 + 3 * S + 900_000);
    let ask = Ask {
        epoch: super::window::window_index(&q, later.micros()),
        ..ask
    };
    let g = server.answer("a", "k", &ask, later, now, 2);
    assert!(g.next_allowance.unwrap() > 50, "{g:?}");
}

/// `q` with its limit (a window's requests, a bucket's rate) set to `limit`.
fn with_limit(q: Quota, limit: u32) -> Quota {
    Quota {
        requests_per_unit: limit,
        ..q
    }
}

/// Three nodes renewing every 100 ms, for four minutes from a minute's start, each offered a
/// hit every 200 ms in the first 20 s of every minute (300 in all: three times a limit of 100);
/// in the second minute the nodes take `to`, one after another, 5, 7 and 9 s in (issue 48's
/// rollout). What each minute admitted.
fn reloaded_over_a_minute(from: Quota, to: Quota) -> Vec<u64> {
    let minute = 60 * S;
    let start = (T0 / minute + 1) * minute;
    let larger = from.requests_per_unit.max(to.requests_per_unit);
    let mut c = Cluster::new(3, with_limit(from, larger));
    c.quotas = vec![from; 3];
    let reloads = [5, 7, 9].map(|s| start + minute + s * S);
    for step in 0..2_400u64 {
        let now = start + step * 100_000;
        for (n, &at) in reloads.iter().enumerate() {
            if now >= at {
                c.quotas[n] = to;
            }
        }
        c.renew_all(now);
        for n in 0..3 {
            if step % 600 < 200 && (step + n as u64).is_multiple_of(2) {
                c.hit(n, now);
            }
        }
    }
    (0..4)
        .map(|m| c.admitted.get(&(start / minute + m)).copied().unwrap_or(0))
        .collect()
}

/// [`reloaded_over_a_minute`] from 100 to `new` a minute, for both windows: the rollout's
/// minute within the larger limit, and each minute after it within the new one. A fixed
/// window uses the new limit in full (at least `least`). A sliding window's minutes, whose
/// hits all come in their first 20 s, are weighed by the minute before, so they take turns
/// (the estimate the cluster's hits make is checked at every hit, `Cluster::hit`).
fn a_limit_changed_over_a_rollout(new: u32, least: u64) {
    let from = quota(Algorithm::FixedWindow, 100, Unit::Minute, 0);
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let from = from.with_algorithm(algorithm);
        let admitted = reloaded_over_a_minute(from, with_limit(from, new));
        eprintln!("{algorithm:?}, 100 then {new}: {admitted:?} a minute");
        // The rollout's minute is held to the smaller limit its asks named; before issue
        // 48's fix each ask naming the other limit started the key again: 154 of 100 when
        // halved, 299 when doubled (as on real processes: 149 to 163, 296 to 300).
        assert!(admitted[1] <= 100, "{algorithm:?}: {admitted:?}");
        for &a in &admitted[2..] {
            assert!(a <= u64::from(new), "{algorithm:?}: {admitted:?}");
            if algorithm == Algorithm::FixedWindow {
                assert!(a >= least, "{algorithm:?}: {admitted:?}");
            }
        }
    }
}

#[test]
fn a_limit_halved_over_a_rollout_keeps_every_window_within_the_old_limit() {
    a_limit_changed_over_a_rollout(50, 48);
}

#[test]
fn a_limit_doubled_over_a_rollout_is_used_from_the_next_window() {
    a_limit_changed_over_a_rollout(200, 190);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Issue 48: a window's limit changed by a reload that reaches the nodes at random times
    /// while they hold allowances (and answers are lost): every window admits at most the
    /// larger of the two limits, and a window all of whose asks came after every node took the
    /// new limit at most the new one.
    #[test]
    fn a_limit_changed_while_nodes_hold_leases_never_passes_the_larger(
        old in 1u32..60,
        new in 1u32..60,
        nodes in 1usize..6,
        sliding in any::<bool>(),
        reload_at in proptest::collection::vec(0usize..400, 6),
        traffic in proptest::collection::vec((0usize..6, 0u64..1_000, 1u64..8), 1..400),
        lost in proptest::collection::vec(any::<bool>(), 64),
    ) {
        let algorithm = if sliding { Algorithm::SlidingWindow } else { Algorithm::FixedWindow };
        let from = quota(algorithm, old, Unit::Second, 0);
        let to = with_limit(from, new);
        let mut c = Cluster::new(nodes, with_limit(from, old.max(new)));
        // When each node's lease first carried the new limit (its first hit after its reload).
        let mut took: Vec<Option<u64>> = vec![None; nodes];
        let mut now = T0;
        for (i, (node, gap, n)) in traffic.into_iter().enumerate() {
            now += gap * 100;
            c.lose = lost[i % lost.len()];
            for (m, q) in c.quotas.iter_mut().enumerate() {
                if i >= reload_at[m] {
                    *q = to;
                }
            }
            if i % 5 == 0 {
                c.renew_all(now);
            }
            let node = node % nodes;
            for _ in 0..n {
                c.hit(node, now);
            }
            if c.quotas[node] == to {
                took[node].get_or_insert(now);
            }
        }
        for (w, a) in &c.admitted {
            prop_assert!(*a <= u64::from(old.max(new)), "window {} admitted {} of {} then {}", w, a, old, new);
        }
        // Every node's lease carries the new limit from `all` on, unless a node holding one
        // had no hit since its reload (its renewals still name the old limit). Asks about a
        // window come from its start less the horizon ahead (two renewals) on.
        let stale = c.held.iter().flatten().any(|h| *h.quota() != to);
        let all = took.iter().flatten().max().copied().unwrap_or(T0);
        for (w, a) in c.admitted.iter().filter(|_| !stale) {
            if *w * S >= all + TIMING.horizon_us() {
                prop_assert!(*a <= u64::from(new), "window {} admitted {} of the new {}", w, a, new);
            }
        }
    }
}

/// A reload that changes a key's algorithm makes another counter, as in forward mode: while
/// it goes over the nodes, the owner keeps a record for each, so the old counter's nodes admit
/// at most its limit and the new counter's at most its own. Before issue 48's fix each ask of
/// the other counter started the key again, and the nodes admitted what they were offered.
#[test]
fn an_algorithm_changed_over_a_rollout_keeps_each_counter_within_its_limit() {
    let from = quota(Algorithm::FixedWindow, 100, Unit::Minute, 0);
    let to = from.with_algorithm(Algorithm::SlidingWindow);
    let minute = 60 * S;
    let start = (T0 / minute + 1) * minute;
    let mut c = Cluster::new(3, from);
    // Node 0 takes the new algorithm 1 s into the minute, node 1 50 s in, node 2 never: each
    // node offered 20 a second, many times the limit.
    let reloads = [start + S, start + 50 * S, u64::MAX];
    for step in 0..600u64 {
        let now = start + step * 100_000;
        for (n, &at) in reloads.iter().enumerate() {
            if now >= at {
                c.quotas[n] = to;
            }
        }
        c.renew_all(now);
        for n in 0..3 {
            c.hit(n, now);
            c.hit(n, now + 50_000);
        }
    }
    let admitted = c.admitted[&(start / minute)];
    eprintln!("fixed then sliding, 100 a minute each: {admitted} in the rollout's minute");
    assert!(
        (190..=200).contains(&admitted),
        "two counters of 100 each: {admitted}"
    );
    // The old counter's record stays until nothing is held in it; then the sweep drops it.
    assert!(c.server.bytes() > 0);
    c.server.sweep(Timestamp::from_micros(start + 3 * minute));
    assert_eq!((c.server.len(), c.server.bytes()), (0, 0));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Buckets whose rate and capacity a reload changes at random times on each node: the
    /// shares stay, each a fraction of the bucket its node runs, and a node's local bucket
    /// keeps its tokens (at most its new capacity). So in any run the nodes admit at most the
    /// larger capacity, the larger rate over the run, and one full share per node.
    #[test]
    fn buckets_whose_rate_changes_admit_at_most_the_larger_rate_and_capacity(
        rates in (1u32..50, 1u32..50),
        bursts in (1u32..20, 1u32..20),
        nodes in 1usize..6,
        leaky in any::<bool>(),
        reload_at in proptest::collection::vec(0usize..600, 6),
        traffic in proptest::collection::vec((0usize..6, 0u64..2_000, 1u64..4), 1..600),
        lost in proptest::collection::vec(any::<bool>(), 64),
    ) {
        let algorithm = if leaky { Algorithm::LeakyBucket } else { Algorithm::TokenBucket };
        let from = quota(algorithm, rates.0, Unit::Second, bursts.0);
        let to = quota(algorithm, rates.1, Unit::Second, bursts.1);
        let mut c = Cluster::new(nodes, from);
        let mut now = T0;
        let mut admitted = 0u64;
        for (i, (node, gap, n)) in traffic.into_iter().enumerate() {
            now += gap * 100;
            c.lose = lost[i % lost.len()];
            for (m, q) in c.quotas.iter_mut().enumerate() {
                if i >= reload_at[m] {
                    *q = to;
                }
            }
            if i % 5 == 0 {
                c.renew_all(now);
            }
            for _ in 0..n {
                admitted += u64::from(c.hit(node % nodes, now));
            }
        }
        let elapsed_s = (now - T0).div_ceil(S);
        let capacity = u64::from(bursts.0.max(bursts.1)) + 1;
        let rate = u64::from(rates.0.max(rates.1));
        let bound = capacity * (1 + nodes as u64) + rate * elapsed_s;
        prop_assert!(admitted <= bound, "admitted {} over {} s, bound {}", admitted, elapsed_s, bound);
    }
}

/// A node holding many keys renews only those something happened to: once a key gave back
/// what it held beyond its use, a round neither renews it nor looks at it (it is parked until
/// its window ends) until a hit comes; a ring change queues every key once; a quiet key is
/// forgotten once its window is over, and so is its owner's record at the owner's sweep.
#[test]
fn a_round_looks_only_at_the_keys_something_happened_to() {
    use super::{LeaseClient, Route};
    let client = LeaseClient::new(TIMING);
    let server = LeaseServer::new(TIMING);
    let q = quota(Algorithm::FixedWindow, 1000, Unit::Hour, 0);
    let at = Timestamp::from_micros;
    let keys: Vec<String> = (0..1000).map(|i| format!("d_user_{i}_")).collect();
    let hit = |key: &str, now: u64| match client.route(key, q, now, 1, || 3, || None) {
        Route::Decided(d) => d,
        Route::Acquire(slot, ask) => {
            let g = server.answer("n0", key, &ask, at(now), at(0), 3);
            slot.answer(Some(&g), now);
            slot.decide_after(now, 1)
        }
        Route::Wait(_) | Route::Forward => panic!("nothing else is under way"),
    };
    let round = |now: u64, changes: u64| {
        let due = client.renewals(now, changes, 3);
        for (key, slot, ask) in &due {
            let g = server.answer("n0", key, ask, at(now), at(0), 3);
            slot.answer(Some(&g), now);
        }
        due.len()
    };
    let queued = || client.queue.lock().unwrap().len();
    for k in &keys {
        assert!(!hit(k, T0).over);
    }
    assert_eq!(queued(), keys.len(), "each key hit is queued once");
    let mut now = T0;
    let mut renewed = Vec::new();
    for _ in 0..20 {
        now += 100_000;
        renewed.push(round(now, 0));
    }
    // An acquire reported the hit and took no more than it: nothing to renew.
    assert_eq!(renewed.iter().sum::<usize>(), 0, "{renewed:?}");
    assert_eq!(queued(), 0, "quiet keys leave the rounds: {renewed:?}");
    assert_eq!(
        client.quiet.len(),
        keys.len(),
        "parked until their window ends"
    );

    // A hit queues its key alone (the next round looks at it and no other; its acquire
    // reported it, so it goes back to the quiet ones).
    assert!(!hit(&keys[7], now).over);
    assert_eq!(queued(), 1);
    now += 100_000;
    assert_eq!(round(now, 0), 0);
    assert_eq!(queued(), 0);
    // A ring change: every key reports to its (maybe new) owner once.
    now += 100_000;
    assert_eq!(round(now, 1), keys.len());
    for _ in 0..20 {
        now += 100_000;
        round(now, 1);
    }
    assert_eq!(queued(), 0);

    // The window over and a lease duration gone: every key forgotten, nothing queued or parked
    // but the new parkings of nothing.
    let end = (T0 / S / 3600 + 1) * 3600 * S;
    assert_eq!(round(end + TIMING.duration_us() + 100_000, 1), 0);
    assert!(client.is_empty(), "{} keys left", client.len());
    assert_eq!(client.quiet.len(), 0);
    // The owner's records go at its sweep, which looks at each key once it may be swept.
    assert_eq!(server.len(), keys.len());
    server.sweep(at(end - 1));
    assert_eq!(server.len(), keys.len(), "in use until the window ends");
    server.sweep(at(end + TIMING.duration_us()));
    assert_eq!(server.len(), 0);
    assert_eq!(server.bytes(), 0, "every charge given back");
}
