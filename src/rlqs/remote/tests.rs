//! Two nodes' quota services wired to each other in process: the owner splits a bucket across
//! both nodes' Envoys, the other node syncs its Envoys and pushes their parts.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::*;
use crate::clock::{ManualClock, Timestamp};
use crate::config::{ConfigHandle, LoadOptions, parse_files};
use crate::rlqs::{Action, RlqsOptions, RlqsStream, Usage};

const CONFIG: &str = "domain: rlqs\ndescriptors:\n  - key: tenant\n    value: acme\n    rate_limit: {unit: second, requests_per_unit: 100}\n";

/// A node's view of the other: `owner` owns every bucket; calls go straight to the other node.
struct Link {
    me: &'static str,
    owner: &'static str,
    other: OnceLock<Arc<RlqsService>>,
    /// The peers this node knows while it reaches no majority of them; 0: it does.
    alone: AtomicU64,
}

impl RlqsPeers for Link {
    fn owner(&self, _key: &str) -> Option<String> {
        (self.me != self.owner).then(|| self.owner.to_owned())
    }

    fn sync<'a>(&'a self, _owner: &'a str, buckets: Vec<SyncBucket>) -> SyncFuture<'a> {
        let other = self.other.get().expect("linked").clone();
        Box::pin(async move { Ok(other.answer_sync(self.me, buckets)) })
    }

    fn alone(&self) -> Option<u64> {
        Some(self.alone.load(Ordering::Relaxed)).filter(|&n| n > 0)
    }
}

/// Node "a" owns the bucket; node "b" syncs with it.
fn two_nodes(ttl_secs: u64) -> (Arc<RlqsService>, Arc<RlqsService>, ManualClock, Arc<Link>) {
    let cfg = || parse_files(&[("q.yaml".into(), CONFIG.into())], &LoadOptions::default()).unwrap();
    let clock = ManualClock::new(Timestamp::from_secs(1_000));
    let options = RlqsOptions {
        ttl: Duration::from_secs(ttl_secs),
        ..RlqsOptions::default()
    };
    let node = |me: &'static str| {
        let link = Arc::new(Link {
            me,
            owner: "a",
            other: OnceLock::new(),
            alone: AtomicU64::new(0),
        });
        let service = Arc::new(
            RlqsService::new(
                ConfigHandle::new(Some(cfg())),
                Arc::new(clock.clone()),
                options.clone(),
            )
            .with_peers(link.clone()),
        );
        (service, link)
    };
    let ((a, link_a), (b, link_b)) = (node("a"), node("b"));
    let _ = link_a.other.set(b.clone());
    let _ = link_b.other.set(a.clone());
    (a, b, clock, link_a)
}

fn acme(attempted: u64) -> Vec<Usage> {
    vec![Usage {
        id: vec![crate::descriptor::Entry::new("tenant", "acme")],
        attempted,
    }]
}

fn per_sec(actions: &[Action]) -> Vec<Option<f64>> {
    actions.iter().map(|a| a.assignment.per_sec()).collect()
}

fn report(s: &mut RlqsStream, attempted: u64) -> Vec<Option<f64>> {
    per_sec(&s.report("rlqs", acme(attempted)).unwrap())
}

#[tokio::test]
async fn the_owner_splits_a_bucket_across_both_nodes_envoys() {
    let (a, b, clock, _) = two_nodes(10);
    let (mut ea, mut eb) = (a.open(), b.open());
    assert_eq!(report(&mut ea, 1), vec![Some(100.0)]);
    // b's Envoy gets nothing until the owner answers, then its part is pushed.
    assert_eq!(report(&mut eb, 1), Vec::<Option<f64>>::new());
    b.sync_once().await;
    assert_eq!(per_sec(&eb.pending()), vec![Some(50.0)]);
    assert_eq!(
        per_sec(&ea.pending()),
        vec![Some(50.0)],
        "the owner's own Envoy gave way"
    );
    // Demands settle: the light Envoy on b gets what it asks (+5 %), the heavy one the rest.
    for _ in 0..5 {
        clock.advance_secs(1);
        report(&mut ea, 120);
        report(&mut eb, 40);
        b.sync_once().await;
    }
    assert_eq!(report(&mut eb, 0), vec![Some(42.0)]);
    assert_eq!(report(&mut ea, 0), vec![Some(58.0)]);
    let owner = a.bucket("rlqs_tenant_acme_").unwrap();
    assert_eq!(owner.assigned, 100.0);
    assert_eq!(owner.holders.len(), 2);
    assert!(b.bucket("rlqs_tenant_acme_").unwrap().assigned <= 100.0);
}

#[tokio::test]
async fn an_envoy_gone_from_the_other_node_frees_its_part_once_it_expires() {
    let (a, b, clock, _) = two_nodes(2);
    let (mut ea, mut eb) = (a.open(), b.open());
    report(&mut ea, 1);
    report(&mut eb, 1);
    // A second report a second later measures the interval: assignments live 2 s from here.
    clock.advance_secs(1);
    report(&mut ea, 1);
    report(&mut eb, 1);
    b.sync_once().await;
    ea.pending();
    drop(eb);
    b.sync_once().await;
    clock.advance_secs(1);
    assert_eq!(
        report(&mut ea, 100),
        vec![Some(50.0)],
        "reserved while it may be enforced"
    );
    clock.advance_secs(1);
    report(&mut ea, 100);
    a.sweep();
    b.sweep();
    b.sync_once().await;
    assert_eq!(per_sec(&ea.pending()), vec![Some(100.0)]);
    assert_eq!(a.bucket("rlqs_tenant_acme_").unwrap().holders.len(), 1);
}

#[tokio::test]
async fn a_restarted_owner_takes_the_other_nodes_envoys_back_at_their_next_sync() {
    let (a, b, _clock, _) = two_nodes(10);
    let (mut ea, mut eb) = (a.open(), b.open());
    report(&mut ea, 1);
    report(&mut eb, 1);
    b.sync_once().await;
    ea.pending();
    assert_eq!(per_sec(&eb.pending()), vec![Some(50.0)]);
    // The owner restarts with an empty table; its own Envoy reconnects before b syncs and is
    // given the whole rate (the documented window: one sync interval at most).
    a.buckets.clear();
    drop(ea);
    let mut ea2 = a.open();
    assert_eq!(report(&mut ea2, 1), vec![Some(100.0)]);
    // b's sync brings its Envoy's part back: the owner's Envoy gives way, b's keeps its 50.
    b.sync_once().await;
    assert_eq!(per_sec(&ea2.pending()), vec![Some(50.0)]);
    assert!(eb.pending().is_empty(), "b's Envoy keeps its part");
    let owner = a.bucket("rlqs_tenant_acme_").unwrap();
    assert_eq!((owner.assigned, owner.holders.len()), (100.0, 2));
}

/// No split brain: the owner cut off from a majority of its 3 peers splits only a third of the
/// rate among its Envoys (the other side goes on with the whole rate), and the whole rate
/// again once it reaches them.
#[tokio::test]
async fn an_owner_without_a_majority_splits_only_its_safe_part() {
    let (a, _b, clock, link) = two_nodes(10);
    let mut ea = a.open();
    assert_eq!(report(&mut ea, 100), vec![Some(100.0)]);
    link.alone.store(3, Ordering::Relaxed);
    clock.advance_secs(1);
    assert_eq!(report(&mut ea, 100), vec![Some(33.3)]);
    link.alone.store(0, Ordering::Relaxed);
    clock.advance_secs(1);
    assert_eq!(report(&mut ea, 100), vec![Some(100.0)]);
}
