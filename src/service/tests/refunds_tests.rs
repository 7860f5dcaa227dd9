//! Negative hits (`is_negative_hits`, envoyproxy/ratelimit's PR #1140): a descriptor whose hits
//! come off its counters, answered OK; which limits take them (SLUICE_NEGATIVE_HITS); the
//! stats they add.

use super::*;
use crate::telemetry::{DecisionTelemetry, Stats};

const REFUNDS: &str = r#"
domain: r
descriptors:
  - key: inflight
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: other
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: sliding
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: sliding_window}
  - key: sliding_charged
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: sliding_window, charge_refused: true}
  - key: bucket_charged
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: token_bucket, charge_refused: true}
  - key: pair
    rate_limits:
      - {unit: hour, requests_per_unit: 3, name: fixed}
      - {unit: hour, requests_per_unit: 2, name: sliding, algorithm: sliding_window}
  - key: free
    rate_limit: {unlimited: true}
  - key: quota
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: slots
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: concurrency}
  - key: slots_shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: concurrency}
  - key: slots_pair
    rate_limits:
      - {unit: minute, requests_per_unit: 2, algorithm: concurrency, name: in_flight}
      - {unit: hour, requests_per_unit: 1, name: hourly, algorithm: sliding_window}
"#;

struct Refunds {
    service: RateLimitService<MemoryStore>,
    stats: Arc<Stats>,
}

fn refunds_with(negative_hits: NegativeHits) -> Refunds {
    let stats = Arc::new(Stats::default());
    let options = ServiceOptions {
        negative_hits,
        ..ServiceOptions::default()
    };
    let (service, _, _) = service_of(REFUNDS, &LoadOptions::default(), 7_200, options);
    let service = service.with_observer(Arc::new(DecisionTelemetry::untraced(stats.clone())));
    Refunds { service, stats }
}

fn refunds() -> Refunds {
    refunds_with(NegativeHits::Counted)
}

fn d(key: &str, value: &str, negative: bool, hits: Option<u64>) -> Descriptor {
    Descriptor {
        negative_hits: negative,
        hits_addend: hits,
        ..desc(&[(key, value)])
    }
}

impl Refunds {
    async fn call(&self, descriptors: Vec<Descriptor>) -> Response {
        self.service
            .should_rate_limit(req("r", descriptors))
            .await
            .expect("no error")
    }

    async fn hit(&self, key: &str) -> Response {
        self.call(vec![d(key, "v", false, None)]).await
    }

    async fn refund(&self, key: &str, hits: u64) -> Response {
        self.call(vec![d(key, "v", true, Some(hits))]).await
    }

    /// The stats of `key` (sanitised), by name.
    fn stat(&self, key: &str, name: &str) -> u64 {
        let at = crate::telemetry::stats::LimitCounters::NAMES
            .iter()
            .position(|n| *n == name)
            .expect("a stat name");
        self.stats
            .entries()
            .iter()
            .find(|e| &*e.name == key)
            .map_or(0, |e| e.counters.values()[at])
    }
}

/// A limit of 3 per hour counting requests in flight, as Envoy counts them: a hit at each
/// request's start, a refund at its end, for refused requests too. The fixed window counted the
/// refused 4th, and its refund takes that back; an admitted request's then frees a place.
#[tokio::test]
async fn a_refund_takes_hits_off_and_is_answered_ok_with_the_limit() {
    let r = refunds();
    for i in 1..=3u32 {
        let a = r.hit("inflight").await;
        assert_eq!(a.overall_code, Code::Ok);
        assert_eq!(a.statuses[0].limit_remaining, 3 - i);
    }
    assert_eq!(r.hit("inflight").await.overall_code, Code::OverLimit);
    // The refused 4th's refund: 4 - 1 = 3, still at the limit.
    let back = r.refund("inflight", 1).await;
    assert_eq!(back.overall_code, Code::Ok);
    assert_eq!(
        back.statuses[0],
        Status {
            code: Code::Ok,
            current_limit: Some(CurrentLimit {
                requests_per_unit: 3,
                unit: Unit::Hour,
                name: String::new(),
            }),
            limit_remaining: 0,
            duration_until_reset_secs: Some(3_600),
        }
    );
    // An admitted request ends: 2 in flight, 1 place.
    assert_eq!(r.refund("inflight", 1).await.statuses[0].limit_remaining, 1);
    assert_eq!(r.hit("inflight").await.overall_code, Code::Ok);
    assert_eq!(r.hit("inflight").await.overall_code, Code::OverLimit);
    // Floored at 0: a refund of 5 on a count of 4 leaves 0, and then 3 fit and the 4th is over.
    assert_eq!(r.refund("inflight", 5).await.statuses[0].limit_remaining, 3);
    let codes: Vec<Code> = [
        r.hit("inflight").await,
        r.hit("inflight").await,
        r.hit("inflight").await,
        r.hit("inflight").await,
    ]
    .iter()
    .map(|a| a.overall_code)
    .collect();
    assert_eq!(
        codes,
        [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit],
        "no credit below 0"
    );
    // Go's stats: the refunds in total_negative_hits, and in nothing else.
    assert_eq!(r.stat("r.inflight", "total_negative_hits"), 7);
    assert_eq!(r.stat("r.inflight", "total_hits"), 10);
    assert_eq!(r.stat("r.inflight", "within_limit"), 7);
    assert_eq!(r.stat("r.inflight", "negative_hits_ignored"), 0);
}

/// A refund is OK in a request whose other descriptor is over: the overall code follows the
/// others. The request-level addend is its hits when it has none of its own, as in Go.
#[tokio::test]
async fn a_refund_beside_an_over_limit_descriptor_is_ok_and_the_request_is_not() {
    let r = refunds();
    r.hit("other").await;
    r.hit("inflight").await;
    r.hit("inflight").await;
    let a = r
        .call(vec![
            d("other", "v", false, None),
            d("inflight", "v", true, None),
        ])
        .await;
    assert_eq!(a.overall_code, Code::OverLimit);
    assert_eq!(a.statuses[0].code, Code::OverLimit);
    assert_eq!(a.statuses[1].code, Code::Ok);
    assert_eq!(a.statuses[1].limit_remaining, 2);
    let a = r
        .service
        .should_rate_limit(Request {
            hits_addend: 2,
            ..req("r", vec![d("inflight", "v", true, None)])
        })
        .await
        .unwrap();
    assert_eq!(a.statuses[0].limit_remaining, 3);
    // No match, unlimited: as for any descriptor, and nothing counted.
    let a = r
        .call(vec![d("nope", "v", true, None), d("free", "v", true, None)])
        .await;
    assert_eq!(a.statuses[..], [Status::ok(), Status::unlimited()]);
    // Quota mode: a refund passes, so not every quota descriptor is over.
    r.hit("quota").await;
    r.hit("quota").await;
    let a = r
        .call(vec![
            d("quota", "v", false, None),
            d("quota", "w", true, None),
        ])
        .await;
    assert_eq!(a.overall_code, Code::Ok);
    assert_eq!(a.statuses[0].code, Code::OverLimit);
}

/// A limit whose refused hits are not counted (a sliding window or a bucket without
/// `charge_refused`) cannot tell a refused request's refund from an admitted one's: by default
/// the refund takes nothing off, is answered OK and is counted as ignored. With
/// `charge_refused: true`, or SLUICE_NEGATIVE_HITS=always, it is taken off.
#[tokio::test]
async fn a_limit_that_does_not_count_refused_hits_ignores_refunds_unless_told() {
    let r = refunds();
    for _ in 0..4 {
        r.hit("sliding").await;
    }
    // Three in flight, the 4th refused (not counted): its refund would free a place nobody
    // holds.
    let back = r.refund("sliding", 1).await;
    assert_eq!(back.overall_code, Code::Ok);
    assert_eq!(back.statuses[0].limit_remaining, 0);
    assert_eq!(r.hit("sliding").await.overall_code, Code::OverLimit);
    assert_eq!(r.stat("r.sliding", "total_negative_hits"), 1);
    assert_eq!(r.stat("r.sliding", "negative_hits_ignored"), 1);

    // Charged refused hits: the 4th was counted, so its refund and one more free a place.
    for key in ["sliding_charged", "bucket_charged"] {
        for _ in 0..4 {
            r.hit(key).await;
        }
        r.refund(key, 1).await;
        assert_eq!(r.hit(key).await.overall_code, Code::OverLimit, "{key}");
        r.refund(key, 2).await;
        assert_eq!(r.hit(key).await.overall_code, Code::Ok, "{key}");
        let stats = format!("r.{key}");
        assert_eq!(r.stat(&stats, "negative_hits_ignored"), 0, "{key}");
    }

    // Always: taken off, as envoyproxy/ratelimit does.
    let always = refunds_with(NegativeHits::Always);
    for _ in 0..3 {
        always.hit("sliding").await;
    }
    assert_eq!(
        always.refund("sliding", 1).await.statuses[0].limit_remaining,
        1
    );
    assert_eq!(always.hit("sliding").await.overall_code, Code::Ok);
    assert_eq!(always.stat("r.sliding", "negative_hits_ignored"), 0);
}

/// A descriptor of several limits: a refund goes to each limit that takes it, and a peek that
/// finds one over gives nothing back from the others (the give-back is for refused charges).
#[tokio::test]
async fn a_refund_on_several_limits_takes_off_where_it_may_and_gives_nothing_back() {
    let r = refunds();
    // 2 pass; the 3rd is over on the sliding window (2), which the fixed window keeps.
    for _ in 0..3 {
        r.hit("pair").await;
    }
    // The fixed window: 3 - 1 = 2. The sliding window (it does not count refused hits) keeps
    // its 2: at its limit, 0 remaining, the status reported.
    let back = r.refund("pair", 1).await;
    assert_eq!(back.statuses[0].code, Code::Ok);
    assert_eq!(back.statuses[0].limit_remaining, 0);
    assert_eq!(r.stat("r.pair", "negative_hits_ignored"), 1);
    // The fixed window's count is 2: with the sliding window full, the next hit is refused, and
    // the fixed window keeps it (3).
    assert_eq!(r.hit("pair").await.overall_code, Code::OverLimit);
}

/// `algorithm: concurrency` through the service: starts take slots and the third is refused;
/// the refused start's refund pays its debt and frees nothing, an admitted one's frees a slot;
/// its refunds are applied under the default SLUICE_NEGATIVE_HITS; the slot stats count.
#[tokio::test]
async fn a_concurrency_limit_takes_slots_and_its_refunds_give_them_back() {
    let r = refunds();
    let remaining = |a: &Response| (a.overall_code, a.statuses[0].limit_remaining);
    assert_eq!(remaining(&r.hit("slots").await), (Code::Ok, 1));
    assert_eq!(remaining(&r.hit("slots").await), (Code::Ok, 0));
    assert_eq!(remaining(&r.hit("slots").await), (Code::OverLimit, 0));
    assert_eq!(remaining(&r.refund("slots", 1).await), (Code::Ok, 0));
    assert_eq!(remaining(&r.refund("slots", 1).await), (Code::Ok, 1));
    assert_eq!(remaining(&r.hit("slots").await), (Code::Ok, 0));
    assert_eq!(r.stat("r.slots", "slots_taken"), 3);
    assert_eq!(r.stat("r.slots", "slots_given_back"), 1);
    assert_eq!(r.stat("r.slots", "negative_hits_ignored"), 0);
    assert_eq!(r.stat("r.slots", "over_limit"), 1);
}

/// Shadow mode answers OK over the limit and takes no slot for it (its debt and refund cancel
/// out); beside another limit of the descriptor, a start refused by that one keeps its slot
/// until the end's refund, as a fixed window keeps a refused request's hits.
#[tokio::test]
async fn a_concurrency_limit_in_shadow_mode_and_beside_another_limit() {
    let r = refunds();
    assert_eq!(r.hit("slots_shadow").await.overall_code, Code::Ok);
    assert_eq!(r.hit("slots_shadow").await.overall_code, Code::Ok);
    assert_eq!(r.stat("r.slots_shadow", "slots_taken"), 1);
    assert_eq!(r.stat("r.slots_shadow", "shadow_mode"), 1);
    r.refund("slots_shadow", 1).await;
    assert_eq!(
        r.refund("slots_shadow", 1).await.statuses[0].limit_remaining,
        1
    );

    // The hourly sliding window admits 1: the second request is refused by it, and keeps the
    // slot it took until its refund.
    assert_eq!(r.hit("slots_pair").await.overall_code, Code::Ok);
    assert_eq!(r.hit("slots_pair").await.overall_code, Code::OverLimit);
    let quota = crate::limiter::Quota {
        charge_refused: true,
        ..crate::limiter::Quota::fixed(2, Unit::Minute)
    }
    .with_algorithm(crate::limiter::Algorithm::Concurrency);
    let now = Timestamp::from_secs(7_200);
    let held = |s: &crate::limiter::concurrency::Slots| (s.held(), s.refused());
    let slots = r.service.store().slots(&quota, "r_slots_pair_v_", now);
    assert_eq!(
        slots.as_ref().map(held),
        Some((2, 0)),
        "both starts hold a slot"
    );
}
