//! Reservations (issue 51, [`super::reserve`]): a request reserves its estimate with
//! `sluice_reserve`, its answer names the reservation, and its end settles the real cost with
//! `sluice_reservation`: what the estimate passed the cost goes back to the window that held it.

use super::*;

const BUDGETS: &str = r#"
domain: ai
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: daily
    rate_limit: {unit: day, requests_per_unit: 1500}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 1000, algorithm: token_bucket}
"#;

struct Budgets {
    service: RateLimitService<MemoryStore>,
    clock: ManualClock,
    stats: Arc<crate::telemetry::Stats>,
}

fn budgets() -> Budgets {
    // 30 s into a minute.
    let load = LoadOptions::default();
    let (service, clock, _) = service_of(BUDGETS, &load, 60_030, ServiceOptions::default());
    let stats = Arc::new(crate::telemetry::Stats::default());
    let observer = crate::telemetry::DecisionTelemetry::untraced(stats.clone());
    let service = service.with_observer(Arc::new(observer));
    Budgets {
        service,
        clock,
        stats,
    }
}

/// A descriptor of `key`'s tenant `t`, with its hits and a reservation entry.
fn budget(key: &str, hits: u64, entry: Option<(&str, &str)>) -> Descriptor {
    let mut entries = vec![(key, "t")];
    entries.extend(entry);
    Descriptor {
        hits_addend: Some(hits),
        ..desc(&entries)
    }
}

impl Budgets {
    async fn call(&self, descriptors: Vec<Descriptor>) -> Response {
        self.service
            .should_rate_limit(req("ai", descriptors))
            .await
            .expect("no error")
    }

    /// Reserves `hits` on `keys`: the token when admitted.
    async fn reserve(&self, keys: &[&str], hits: u64) -> Option<String> {
        let d = keys
            .iter()
            .map(|k| budget(k, hits, Some((RESERVE, "1"))))
            .collect();
        let a = self.call(d).await;
        let token = a
            .dynamic_metadata
            .as_ref()
            .and_then(|m| m.get(RESERVATION))
            .and_then(|t| t.as_str())
            .map(str::to_owned);
        assert_eq!(token.is_some(), a.overall_code == Code::Ok, "{a:?}");
        token
    }

    /// Settles `token` with its real `cost` on `key`: answered OK.
    async fn settle(&self, key: &str, token: &str, cost: u64) {
        let a = self
            .call(vec![budget(key, cost, Some((RESERVATION, token)))])
            .await;
        assert_eq!(a.overall_code, Code::Ok, "{a:?}");
    }

    /// `key`'s counter as the debug port shows it: (count, used, reserved).
    async fn budget_of(&self, key: &str) -> (u64, Option<u64>, Option<u64>) {
        let views = self
            .service
            .inspect_counters(&req("ai", vec![desc(&[(key, "t")])]))
            .await
            .expect("no error");
        let json = crate::service::admin::counter_json(&views[0]);
        let n = |f: &str| json.get(f).and_then(serde_json::Value::as_u64);
        (n("count").unwrap(), n("used"), n("reserved"))
    }

    /// What `key`'s limit has left: a peek.
    async fn left(&self, key: &str) -> u32 {
        self.call(vec![budget(key, 0, None)]).await.statuses[0].limit_remaining
    }
}

#[tokio::test]
async fn a_settle_gives_back_what_the_estimate_passed_the_cost() {
    let b = budgets();
    let first = b.reserve(&["tenant"], 500).await.expect("admitted");
    b.reserve(&["tenant"], 500).await.expect("admitted");
    // Refused, and nothing left behind (a fixed window counts refused hits: given back).
    assert_eq!(b.reserve(&["tenant"], 1).await, None);
    assert_eq!(b.left("tenant").await, 0);
    // The first used 100 of its 500: 400 come back.
    b.settle("tenant", &first, 100).await;
    assert_eq!(b.left("tenant").await, 400);
    assert_eq!(b.reserve(&["tenant"], 401).await, None);
    assert!(b.reserve(&["tenant"], 400).await.is_some());
}

#[tokio::test]
async fn a_reservation_settled_after_its_window_ended_gives_nothing_to_the_new_one() {
    let b = budgets();
    let old = b.reserve(&["tenant"], 500).await.expect("admitted");
    // The stream ends in the next minute, which has its own 600 reserved.
    b.clock.advance_secs(45);
    b.reserve(&["tenant"], 600).await.expect("admitted");
    b.settle("tenant", &old, 100).await;
    // The plain refund recipe would give the new window the old one's 400: 800 admitted.
    assert_eq!(b.left("tenant").await, 400);
}

#[tokio::test]
async fn a_cost_past_the_estimate_is_charged_never_refused() {
    let b = budgets();
    let t = b.reserve(&["tenant"], 500).await.expect("admitted");
    b.reserve(&["tenant"], 400).await.expect("admitted");
    // 900 reserved; the first cost 700: 200 more, past the limit, charged and answered OK.
    b.settle("tenant", &t, 700).await;
    assert_eq!(b.left("tenant").await, 0);
    assert_eq!(b.reserve(&["tenant"], 1).await, None);
}

#[tokio::test]
async fn a_refused_request_gives_back_what_its_other_budgets_took() {
    let b = budgets();
    b.reserve(&["tenant", "daily"], 600)
        .await
        .expect("admitted");
    // The minute refuses the second 600; the day, which admitted it, gets it back.
    assert_eq!(b.reserve(&["tenant", "daily"], 600).await, None);
    assert_eq!(b.left("daily").await, 900);
    assert_eq!(b.left("tenant").await, 400);
}

#[tokio::test]
async fn a_bucket_takes_its_settle_back_whenever_it_comes() {
    let b = budgets();
    let t = b.reserve(&["bucket"], 600).await.expect("admitted");
    b.settle("bucket", &t, 100).await;
    // 500 back: 900 left of the burst (refill aside, the clock did not move).
    assert_eq!(b.left("bucket").await, 900);
}

#[tokio::test]
async fn a_bad_reservation_is_refused_naming_its_descriptor() {
    let b = budgets();
    for token in ["", "12", "x.5", "5.y"] {
        let e = b
            .service
            .should_rate_limit(req(
                "ai",
                vec![budget("tenant", 1, Some((RESERVATION, token)))],
            ))
            .await
            .expect_err("a bad token");
        assert!(e.is_invalid_argument(), "{e}");
        assert!(e.to_string().contains("descriptor 0"), "{e}");
    }
}

#[tokio::test]
async fn plain_requests_carry_no_reservation() {
    let b = budgets();
    let a = b.call(vec![budget("tenant", 10, None)]).await;
    assert_eq!(a.dynamic_metadata, None);
}

#[tokio::test]
async fn the_debug_port_shows_a_tenants_used_and_reserved_hits_apart() {
    let b = budgets();
    let first = b
        .reserve(&["tenant", "daily"], 500)
        .await
        .expect("admitted");
    let second = b.reserve(&["tenant"], 300).await.expect("admitted");
    assert_eq!(b.budget_of("tenant").await, (800, Some(0), Some(800)));
    assert_eq!(b.budget_of("daily").await, (500, Some(0), Some(500)));
    // A refused reservation leaves nothing reserved.
    assert_eq!(b.reserve(&["tenant"], 300).await, None);
    assert_eq!(b.budget_of("tenant").await, (800, Some(0), Some(800)));
    b.settle("tenant", &first, 120).await;
    b.settle("daily", &first, 120).await;
    assert_eq!(b.budget_of("tenant").await, (420, Some(120), Some(300)));
    assert_eq!(b.budget_of("daily").await, (120, Some(120), Some(0)));
    // Settled in the next window: the old window keeps both, the new one holds neither.
    b.clock.advance_secs(45);
    b.settle("tenant", &second, 300).await;
    assert_eq!(b.budget_of("tenant").await, (0, Some(0), Some(0)));
    // A bucket has no reserved twin.
    b.reserve(&["bucket"], 10).await.expect("admitted");
    assert_eq!(b.budget_of("bucket").await.2, None);
}

#[tokio::test]
async fn reservations_opened_settled_and_settled_late_are_counted() {
    let b = budgets();
    let on_time = b.reserve(&["tenant"], 400).await.expect("admitted");
    let late = b
        .reserve(&["tenant", "daily"], 500)
        .await
        .expect("admitted");
    // Refused: opens nothing.
    assert_eq!(b.reserve(&["tenant"], 500).await, None);
    b.settle("tenant", &on_time, 100).await;
    // The minute ends (the day does not): the settle is late for its minute's counter.
    b.clock.advance_secs(45);
    b.call(vec![
        budget("tenant", 200, Some((RESERVATION, &late))),
        budget("daily", 200, Some((RESERVATION, &late))),
    ])
    .await;
    let s = &b.stats.service;
    let n = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    // One a reserving descriptor: the second request reserved two budgets.
    assert_eq!(n(&s.reservations_opened), 3);
    assert_eq!(n(&s.reservations_settled), 3);
    assert_eq!(n(&s.reservations_settled_late), 1);
}
