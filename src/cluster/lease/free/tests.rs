use std::collections::HashMap;

use proptest::prelude::*;

use super::*;
use crate::clock::Timestamp;
use crate::cluster::lease::client::{Held, Local};
use crate::cluster::lease::server::{Ask, LeaseServer, LeaseTiming};
use crate::cluster::lease::window::micros;
use crate::limiter::Unit;

const S: u64 = 1_000_000;
/// A minute boundary, far from the epoch.
const T0: u64 = 1_700_000_040 * S;
/// The defaults, with free shares on at half of each limit.
const TIMING: LeaseTiming = LeaseTiming {
    free_share_ppm: 500_000,
    ..LeaseTiming::DEFAULT
};

fn minute(limit: u32) -> Quota {
    Quota::fixed(limit, Unit::Minute)
}

fn terms(since_us: u64, until_us: u64, share_ppm: u64) -> Option<Terms> {
    Some(Terms {
        since_us,
        until_us,
        share_ppm,
    })
}

/// A table for a node started long ago.
fn table() -> FreeShares {
    FreeShares::new(0, TIMING.duration_us(), micros(TIMING.renew), 1 << 20)
}

#[test]
fn a_key_below_its_free_share_costs_no_call_and_past_it_takes_a_lease_with_what_it_used() {
    let free = table();
    let q = minute(100);
    // A tenth of the limit: 10 hits a minute on this node, with no call.
    let t = terms(0, T0 + 60 * S, PPM / 10);
    for i in 0..10 {
        let FreeRoute::Admitted(d) = free.admit("k", &q, T0 + i, 1, t) else {
            panic!("hit {i} is free");
        };
        assert_eq!((d.count_before, d.count_after, d.over), (i, i + 1, false));
    }
    assert_eq!(
        free.admit("k", &q, T0 + 10, 1, t),
        FreeRoute::Lease { used: 10 }
    );
    // Converted: the rest of the window is the lease's, and what was used is reported once.
    assert_eq!(
        free.admit("k", &q, T0 + 11, 1, t),
        FreeRoute::Lease { used: 0 }
    );
    // The next window is free again.
    assert!(matches!(
        free.admit("k", &q, T0 + 60 * S, 1, terms(0, T0 + 120 * S, PPM / 10)),
        FreeRoute::Admitted(_)
    ));
}

#[test]
fn nothing_is_free_without_a_permit_nor_in_a_window_begun_before_the_run_or_the_start() {
    let q = minute(100);
    let share = PPM / 10;
    let free = table();
    // No permit, or one that ended.
    assert_eq!(
        free.admit("a", &q, T0, 1, None),
        FreeRoute::Lease { used: 0 }
    );
    assert_eq!(
        free.admit("b", &q, T0, 1, terms(0, T0, share)),
        FreeRoute::Lease { used: 0 }
    );
    // A run begun less than a lease duration before the window began.
    let since = T0 - TIMING.duration_us() + 1;
    let t = terms(since, T0 + S, share);
    assert_eq!(free.admit("c", &q, T0, 1, t), FreeRoute::Lease { used: 0 });
    let since = T0 - TIMING.duration_us();
    assert!(matches!(
        free.admit("d", &q, T0, 1, terms(since, T0 + S, share)),
        FreeRoute::Admitted(_)
    ));
    // A node started within the window: what it admitted before is gone with its restart.
    let restarted = FreeShares::new(T0 + 1, TIMING.duration_us(), micros(TIMING.renew), 1 << 20);
    let t = terms(0, T0 + 60 * S, share);
    assert_eq!(
        restarted.admit("e", &q, T0 + 2, 1, t),
        FreeRoute::Lease { used: 0 }
    );
    // Not a plain fixed window: buckets, sliding windows and charged refusals lease.
    let sliding = Quota {
        algorithm: Algorithm::SlidingWindow,
        ..minute(100)
    };
    assert_eq!(
        free.admit("f", &sliding, T0, 1, t),
        FreeRoute::Lease { used: 0 }
    );
    // A share below one hit.
    assert_eq!(
        free.admit("g", &minute(9), T0, 1, t),
        FreeRoute::Lease { used: 0 }
    );
}

#[test]
fn keys_converted_at_a_ring_change_report_what_they_used_and_ended_windows_are_forgotten() {
    let free = table();
    let q = minute(100);
    let t = terms(0, T0 + 120 * S, PPM / 10);
    for key in ["a", "b"] {
        for i in 0..3 {
            free.admit(key, &q, T0 + i, 1, t);
        }
    }
    let mut converted = Vec::new();
    free.convert_all(T0 + 5, |k, _, used| converted.push((k.to_owned(), used)));
    converted.sort();
    assert_eq!(converted, [("a".to_owned(), 3), ("b".to_owned(), 3)]);
    assert_eq!(
        free.admit("a", &q, T0 + 6, 1, t),
        FreeRoute::Lease { used: 0 }
    );
    assert_eq!(free.len(), 2);
    let bytes = free.bytes();
    assert!(bytes >= 2 * FREE_CHARGE);
    free.forget_ended(T0 + 60 * S - 1);
    assert_eq!(free.len(), 2);
    free.forget_ended(T0 + 60 * S);
    assert_eq!((free.len(), free.bytes()), (0, 0));
}

#[test]
fn a_permit_run_lasts_while_renewed_and_the_owner_charges_the_runs_that_held_at_a_start() {
    let permits = Permits::new(TIMING.duration_us());
    let p = permits.give("a", T0, PPM / 10).unwrap();
    assert_eq!((p.since_us, p.valid_us), (T0, TIMING.duration_us()));
    // Renewed in time: the same run.
    let p = permits.give("a", T0 + 900_000, PPM / 10).unwrap();
    assert_eq!(p.since_us, T0);
    // Lapsed: a new run.
    let p = permits.give("a", T0 + 3 * S, PPM / 10).unwrap();
    assert_eq!(p.since_us, T0 + 3 * S);
    permits.give("b", T0 + 3 * S, PPM / 10).unwrap();
    let records = permits.read();
    // What `asker` is reserved of a window of 100 that began at `start`, granted at `now`,
    // `reported` excepted, and who was charged.
    // What `asker` is reserved when the window already charges `covered` (a node and what).
    let reserve_covered = |asker: &str, (node, covered): (&str, u64), (start, now, ahead)| {
        let mut charged = Vec::new();
        let sum = Permits::reserve(
            &records,
            100,
            (start, now, ahead),
            asker,
            |n| if n == node { covered } else { 0 },
            |n| charged.push(n.to_owned()),
        );
        (sum, charged)
    };
    let reserve =
        |asker: &str, reported: &str, window| reserve_covered(asker, (reported, u64::MAX), window);
    let w = |start, now| reserve("x", "", (start, now, false));
    // A window that began while a's permit held: a is charged 10 of 100 (b began later).
    assert_eq!(w(T0 + 2 * S, T0 + 3 * S), (10, vec!["a".to_owned()]));
    assert_eq!(w(T0 + 3 * S, T0 + 3 * S + 1).0, 20);
    // The asker and the nodes that reported are not charged.
    let after = (T0 + 3 * S, T0 + 3 * S + 1, false);
    assert_eq!(reserve("a", "", after), (10, vec!["b".to_owned()]));
    assert_eq!(reserve("x", "a", after), (10, vec!["b".to_owned()]));
    // A node granted an allowance in the window (ahead, before it reported) uses it or its
    // free share, not both: it is charged only what its free share passes the allowance by.
    assert_eq!(
        reserve_covered("x", ("a", 30), after),
        (10, vec!["b".to_owned()])
    );
    let both = vec!["a".to_owned(), "b".to_owned()];
    assert_eq!(reserve_covered("x", ("a", 4), after), (16, both));
    // Before any permit: nothing. Ahead: every permit that holds now.
    assert_eq!(w(T0 - S, T0), (0, Vec::new()));
    assert_eq!(reserve("x", "", (T0 + 60 * S, T0 + 3 * S + 1, true)).0, 20);
}

/// `nodes` nodes deciding one fixed-window key from free shares and leases granted by one
/// owner, hit by hit, as `LeaseClient` and the lease driver do.
struct FreeCluster {
    server: LeaseServer,
    free: Vec<FreeShares>,
    held: Vec<Option<Held>>,
    terms: Vec<Option<Terms>>,
    quota: Quota,
    admitted: HashMap<u64, u64>,
    lose: bool,
    calls: u64,
}

impl FreeCluster {
    fn new(nodes: usize, quota: Quota) -> Self {
        FreeCluster {
            server: LeaseServer::new(TIMING),
            free: (0..nodes).map(|_| table()).collect(),
            held: (0..nodes).map(|_| None).collect(),
            terms: vec![None; nodes],
            quota,
            admitted: HashMap::new(),
            lose: false,
            calls: 0,
        }
    }

    fn name(n: usize) -> String {
        format!("10.0.0.{n}:8082")
    }

    /// A Lease call from `node` at `now` (its permit renewed), carrying `ask` if any.
    fn call(&mut self, node: usize, ask: Option<Ask>, now: u64) {
        self.calls += 1;
        let share = TIMING.free_share_ppm / self.free.len() as u64;
        let permit = self.server.permits.give(&Self::name(node), now, share);
        let grant = ask.map(|ask| {
            self.server.answer(
                &Self::name(node),
                "k",
                &ask,
                Timestamp::from_micros(now),
                Timestamp::from_micros(0),
                self.free.len(),
            )
        });
        // Taken with the answer, and lost with it.
        let recalls = self.server.permits.take_recalls(&Self::name(node));
        if self.lose {
            if let Some(h) = self.held[node].as_mut() {
                h.failed();
            }
            return;
        }
        for r in recalls.iter().filter(|_| permit.is_some()) {
            if let Some(used) = self.free[node].recall(&r.key, &r.quota, now) {
                let held = self.held_or_new(node, now);
                held.took_freely(now, used);
                held.recall(now, r.until_us);
            }
        }
        let t = permit.map(|p| Terms {
            since_us: p.since_us,
            until_us: now + p.valid_us,
            share_ppm: p.share_ppm,
        });
        if let (Some(old), Some(new)) = (self.terms[node], t)
            && old.since_us != new.since_us
        {
            self.convert(node, now);
        }
        self.terms[node] = t;
        if let (Some(g), Some(h)) = (grant, self.held[node].as_mut()) {
            h.grant(&g, now);
        }
    }

    /// What `node` admitted freely becomes a lease holding it (a ring change, a new run).
    fn convert(&mut self, node: usize, now: u64) {
        let mut used = None;
        self.free[node].convert_all(now, |_, _, u| used = Some(u));
        if let Some(u) = used {
            self.held_or_new(node, now).took_freely(now, u);
        }
    }

    fn held_or_new(&mut self, node: usize, now: u64) -> &mut Held {
        let (q, live) = (self.quota, self.free.len() as u64);
        self.held[node].get_or_insert_with(|| Held::new(q, now, live))
    }

    fn hit(&mut self, node: usize, now: u64) {
        let renew = micros(TIMING.renew);
        if self.held[node].is_none() {
            match self.free[node].admit("k", &self.quota, now, 1, self.terms[node]) {
                FreeRoute::Admitted(_) => return self.count(now),
                FreeRoute::Lease { used } => self.held_or_new(node, now).took_freely(now, used),
            }
        }
        let held = self.held[node].as_mut().expect("held");
        let admitted = match held.decide(now, 1, renew) {
            Local::Decided(d) => !d.over,
            Local::Wait => false,
            Local::Acquire(ask) => {
                self.call(node, Some(ask), now);
                let held = self.held[node].as_mut().expect("held");
                !held.decide_after_acquire(now, 1).over
            }
        };
        if admitted {
            self.count(now);
        }
    }

    fn count(&mut self, now: u64) {
        let window = now / S / self.quota.window().secs();
        *self.admitted.entry(window).or_default() += 1;
    }

    /// A renewal round on every node: its lease renewed, and its permit.
    fn renew_all(&mut self, now: u64) {
        for n in 0..self.free.len() {
            let ask = self.held[n]
                .as_mut()
                .and_then(|h| h.renewal(now, 0, &TIMING));
            self.call(n, ask, now);
            self.free[n].forget_ended(now);
        }
    }
}

#[test]
fn a_key_used_below_its_free_shares_costs_no_call_and_a_hot_one_still_gets_its_limit() {
    let mut c = FreeCluster::new(3, minute(600));
    // Permits first (renewed every half second), then a window that begins a lease duration
    // after they did.
    let start = T0 + 60 * S;
    let mut now = T0;
    while now < start {
        c.renew_all(now);
        now += 500_000;
    }
    c.calls = 0;
    // 90 hits on each node (a sixth of 600 is 100): no call.
    for i in 0..90 {
        for n in 0..3 {
            c.hit(n, start + i * 1_000);
        }
    }
    assert_eq!(c.calls, 0);
    // Node 0 goes on alone: it converts, and gets what the others leave. The owner charges
    // the others their free share (99 each) until they report, and recalls the key from them:
    // at their next call they report the 90 each used, and node 0 gets the rest.
    now = start + 100_000;
    for _ in 0..2_000 {
        now += 1_000;
        c.hit(0, now);
        if now.is_multiple_of(100_000) {
            c.renew_all(now);
        }
    }
    assert!(c.calls > 0);
    let window = start / S / 60;
    assert_eq!(c.admitted[&window], 600);
    // The others keep reporting in the next window (the recall lasts two windows), so node 0
    // gets the whole limit there with no recall to wait for.
    let next = start + 60 * S;
    now = next;
    for _ in 0..1_200 {
        now += 1_000;
        c.hit(0, now);
        if now.is_multiple_of(100_000) {
            c.renew_all(now);
        }
    }
    assert_eq!(c.admitted[&(window + 1)], 600);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn free_shares_and_leases_never_pass_the_limit(
        limit in 1u32..300,
        nodes in 1usize..6,
        traffic in proptest::collection::vec((0usize..6, 0u64..20_000, 1u64..4), 1..500),
        lost in proptest::collection::vec(any::<bool>(), 64),
        changes in proptest::collection::vec(0usize..500, 0..4),
    ) {
        let q = Quota::fixed(limit, Unit::Second);
        let mut c = FreeCluster::new(nodes, q);
        c.renew_all(T0);
        let mut now = T0 + 2 * S;
        for (i, (node, gap, n)) in traffic.into_iter().enumerate() {
            now += gap * 100;
            c.lose = lost[i % lost.len()];
            if i % 5 == 0 {
                c.renew_all(now);
            }
            if changes.contains(&i) {
                // A ring change: every node converts what it admitted freely.
                for n in 0..nodes {
                    c.convert(n, now);
                }
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
fn a_recalled_key_reports_what_it_used_then_in_each_window_until_the_recall_ends() {
    use crate::cluster::lease::LeaseClient;
    let client = LeaseClient::with_free_shares(TIMING, 0);
    let q = minute(600);
    let t = terms(0, T0 + 600 * S, PPM / 6);
    let start = T0 + 60 * S;
    for i in 0..7 {
        let route = client.route("k", q, start + i, 1, || 3, || t);
        assert!(matches!(route, crate::cluster::lease::Route::Decided(_)));
    }
    // Recalled for two windows: the next round reports the 7 hits admitted freely.
    let until = start + 120 * S;
    client.recall("k", q, until, start + S, 3);
    let round = |at: u64| {
        let due = client.renewals(at, 0, 3);
        for (_, slot, ask) in &due {
            let grant = crate::cluster::lease::Grant {
                epoch: ask.epoch,
                allowance: ask.keep,
                valid_us: 60 * S,
                leased: true,
                ..Default::default()
            };
            slot.answer(Some(&grant), at);
        }
        due.iter()
            .map(|(_, _, a)| (a.epoch, a.used))
            .collect::<Vec<_>>()
    };
    let window = start / S / 60;
    assert_eq!(round(start + S), vec![(window, 7)]);
    // Nothing more in the window; the key is decided from its lease, not freely.
    assert_eq!(round(start + 2 * S), vec![]);
    let free = client.free().expect("free shares on");
    assert_eq!(
        free.admit("k", &q, start + 3 * S, 1, t),
        FreeRoute::Lease { used: 0 }
    );
    // The next window: a report of nothing used, at its first rounds, with no hit.
    let next = start + 60 * S;
    let tick = micros(TIMING.renew);
    let mut reports = Vec::new();
    for i in 0..3 {
        reports.extend(round(next + i * tick));
    }
    assert_eq!(reports, vec![(window + 1, 0)]);
    // After the recall's last window, the key is forgotten.
    for i in 0..3 {
        round(until + 60 * S + i * tick);
    }
    assert!(client.is_empty());
}
