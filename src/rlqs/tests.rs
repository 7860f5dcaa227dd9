//! The service driven as streams would drive it, with a manual clock: mapping, the split across
//! streams, pushes, expiry, abandon, the caps.

use std::sync::Arc;

use super::*;
use crate::clock::{ManualClock, Timestamp};
use crate::config::{ConfigHandle, LoadOptions, parse_files};

const CONFIG: &str = r#"
domain: rlqs
descriptors:
  - key: tenant
    value: acme
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: tenant
    value: free
    rate_limit: {unlimited: true}
  - key: tenant
    value: banned
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: tenant
    value: quiet
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: plan
    value: gold
    descriptors:
      - key: tenant
        rate_limit: {unit: minute, requests_per_unit: 600, algorithm: token_bucket, burst: 50}
"#;

fn service(options: RlqsOptions) -> (Arc<RlqsService>, ManualClock) {
    let cfg = parse_files(&[("q.yaml".into(), CONFIG.into())], &LoadOptions::default()).unwrap();
    let clock = ManualClock::new(Timestamp::from_secs(1_000));
    let s = RlqsService::new(
        ConfigHandle::new(Some(cfg)),
        Arc::new(clock.clone()),
        options,
    );
    (Arc::new(s), clock)
}

fn usage(pairs: &[(&str, &str)], attempted: u64) -> Usage {
    Usage {
        id: pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect(),
        attempted,
    }
}

fn acme(attempted: u64) -> Vec<Usage> {
    vec![usage(&[("tenant", "acme")], attempted)]
}

fn per_sec(actions: &[Action]) -> Vec<Option<f64>> {
    actions.iter().map(|a| a.assignment.per_sec()).collect()
}

#[test]
fn buckets_map_to_the_yaml_and_each_rule_to_its_assignment() {
    let (s, _) = service(RlqsOptions::default());
    let mut st = s.open();
    let actions = st
        .report(
            "rlqs",
            vec![
                usage(&[("tenant", "acme")], 1),
                usage(&[("tenant", "free")], 1),
                usage(&[("tenant", "banned")], 1),
                usage(&[("tenant", "quiet")], 1),
                usage(&[("tenant", "nobody")], 1),
                // Keys sorted bytewise: plan, then tenant under it.
                usage(&[("tenant", "x"), ("plan", "gold")], 1),
            ],
        )
        .unwrap();
    let got: Vec<Assignment> = actions.iter().map(|a| a.assignment).collect();
    assert_eq!(
        got,
        vec![
            Assignment::TokenBucket {
                max_tokens: 100,
                tokens_per_fill: 1_000,
                fill_secs: 10
            },
            Assignment::AllowAll,
            Assignment::DenyAll,
            Assignment::AllowAll,
            Assignment::AllowAll,
            Assignment::TokenBucket {
                max_tokens: 50,
                tokens_per_fill: 1_200,
                fill_secs: 120
            },
        ]
    );
    assert!(actions.iter().all(|a| a.ttl_secs == 10));
    assert_eq!(
        &*actions[5].id,
        &[Entry::new("plan", "gold"), Entry::new("tenant", "x")]
    );
    assert_eq!(s.gauges().buckets, 2);
}

#[test]
fn a_key_order_puts_named_keys_first() {
    let (s, _) = service(RlqsOptions {
        key_order: KeyOrder::new(vec!["tenant".into()]),
        ..RlqsOptions::default()
    });
    let mut st = s.open();
    let a = st
        .report("rlqs", vec![usage(&[("plan", "gold"), ("tenant", "x")], 1)])
        .unwrap();
    // tenant first: no rule `tenant: x` with `plan` under it, so no limit.
    assert_eq!(a[0].assignment, Assignment::AllowAll);
}

#[test]
fn the_first_report_names_the_domain_and_it_never_changes() {
    let (s, _) = service(RlqsOptions::default());
    let mut st = s.open();
    assert_eq!(st.report("", acme(1)), Err(StreamError::NoDomain));
    st.report("rlqs", acme(1)).unwrap();
    // Later reports may leave it out.
    assert_eq!(st.report("", acme(1)).unwrap().len(), 1);
    assert!(matches!(
        st.report("other", acme(1)),
        Err(StreamError::DomainChanged { .. })
    ));
}

#[test]
fn malformed_bucket_ids_are_skipped_and_counted() {
    let (s, _) = service(RlqsOptions {
        max_entries: 2,
        ..RlqsOptions::default()
    });
    let mut st = s.open();
    let long = "v".repeat(5_000);
    let actions = st
        .report(
            "rlqs",
            vec![
                usage(&[], 1),
                usage(&[("", "x")], 1),
                usage(&[("a", "1"), ("b", "2"), ("c", "3")], 1),
                usage(&[("tenant", &long)], 1),
                usage(&[("tenant", "acme")], 1),
            ],
        )
        .unwrap();
    assert_eq!(actions.len(), 1);
    assert_eq!(s.counters.malformed.load(Ordering::Relaxed), 4);
}

#[test]
fn two_envoys_split_a_bucket_and_changes_are_pushed_to_the_other() {
    let (s, clock) = service(RlqsOptions::default());
    let (mut a, mut b) = (s.open(), s.open());
    assert_eq!(
        per_sec(&a.report("rlqs", acme(1)).unwrap()),
        vec![Some(100.0)]
    );
    // b arrives unmeasured: an equal split at once; a's smaller part is pushed to it.
    assert_eq!(
        per_sec(&b.report("rlqs", acme(1)).unwrap()),
        vec![Some(50.0)]
    );
    assert_eq!(per_sec(&a.pending()), vec![Some(50.0)]);
    assert!(a.pending().is_empty(), "a push is sent once");
    for _ in 0..4 {
        clock.advance_secs(1);
        a.report("rlqs", acme(120)).unwrap();
        b.report("rlqs", acme(40)).unwrap();
    }
    let (pa, pb) = (
        a.report("rlqs", acme(120)).unwrap(),
        b.report("rlqs", acme(40)).unwrap(),
    );
    assert_eq!(per_sec(&pb), vec![Some(42.0)]);
    assert_eq!(per_sec(&pa), vec![Some(58.0)]);
    let view = s.bucket("rlqs_tenant_acme_").unwrap();
    assert_eq!(view.assigned, 100.0);
    assert_eq!(view.holders.len(), 2);
}

/// 64 Envoys on one bucket, each reporting once a second: the split runs once per eighth of a
/// round of reports (8 a round), not once per report (64 a round), and the parts still follow
/// demand (a heavy Envoy gets what the light ones leave) and never sum past the limit.
#[test]
fn a_shared_bucket_is_split_a_few_times_a_round_not_on_every_report() {
    const N: usize = 64;
    let (s, clock) = service(RlqsOptions::default());
    let mut streams: Vec<RlqsStream> = (0..N).map(|_| s.open()).collect();
    for st in &mut streams {
        st.report("rlqs", acme(1)).unwrap();
    }
    let splits = || s.buckets.get("rlqs_tenant_acme_").unwrap().splits;
    let joined = splits();
    assert_eq!(joined, N as u64, "each new Envoy splits at once");
    // A light Envoy's claim: 1/s plus 5% is 10.5 tokens of 0.1 request, rounded down to 10.
    let (light, light_claim) = (N as f64 - 1.0, 1.0);
    for round in 1..=4u64 {
        clock.advance_secs(1);
        for (i, st) in streams.iter_mut().enumerate() {
            st.report("rlqs", acme(if i == 0 { 200 } else { 1 }))
                .unwrap();
            st.pending();
        }
        let view = s.bucket("rlqs_tenant_acme_").unwrap();
        assert!(view.assigned <= 100.0, "round {round}: {}", view.assigned);
        assert_eq!(splits() - joined, round * 8, "round {round}");
    }
    // The heavy Envoy's part: the limit less the light ones' claims, give or take the
    // hysteresis.
    let view = s.bucket("rlqs_tenant_acme_").unwrap();
    let heavy = view
        .holders
        .iter()
        .find(|h| h.stream == streams[0].id())
        .unwrap();
    let fair = 100.0 - light * light_claim;
    assert!(
        (heavy.assigned - fair).abs() <= fair * 0.06,
        "{} vs {fair}",
        heavy.assigned
    );
}

#[test]
fn a_closed_stream_keeps_its_part_until_it_expires_then_the_other_gets_it() {
    let (s, clock) = service(RlqsOptions {
        ttl: Duration::from_secs(3),
        ..RlqsOptions::default()
    });
    let mut a = s.open();
    let mut b = s.open();
    a.report("rlqs", acme(1)).unwrap();
    // b's first assignment lives twice the assumed interval (5 s): 10 s.
    assert_eq!(b.report("rlqs", acme(1)).unwrap()[0].ttl_secs, 10);
    a.pending();
    drop(b);
    assert_eq!(s.gauges().streams, 1);
    for second in 1..=10 {
        clock.advance_secs(1);
        assert_eq!(
            per_sec(&a.report("rlqs", acme(100)).unwrap()),
            vec![Some(50.0)]
        );
        s.sweep();
        if second < 10 {
            assert!(
                a.pending().is_empty(),
                "reserved while b's assignment lives ({second} s)"
            );
        }
    }
    assert_eq!(per_sec(&a.pending()), vec![Some(100.0)]);
    assert_eq!(s.counters.expired.load(Ordering::Relaxed), 1);
    assert_eq!(s.gauges().holders, 1);
}

#[test]
fn the_ttl_covers_two_reporting_intervals() {
    let (s, clock) = service(RlqsOptions {
        ttl: Duration::from_secs(2),
        ..RlqsOptions::default()
    });
    let mut a = s.open();
    // Unmeasured, the interval is taken to be Envoy 1.39's 5 s.
    assert_eq!(a.report("rlqs", acme(1)).unwrap()[0].ttl_secs, 10);
    clock.advance_secs(1);
    assert_eq!(a.report("rlqs", acme(1)).unwrap()[0].ttl_secs, 2);
    clock.advance_secs(7);
    assert_eq!(a.report("rlqs", acme(1)).unwrap()[0].ttl_secs, 14);
}

#[test]
fn quiet_buckets_are_abandoned_and_their_memory_freed() {
    let (s, clock) = service(RlqsOptions {
        abandon_idle: Duration::from_secs(5),
        ..RlqsOptions::default()
    });
    let mut a = s.open();
    a.report("rlqs", acme(1)).unwrap();
    let bytes = s.gauges().bytes;
    assert!(bytes > 0);
    let mut pushed = Vec::new();
    for _ in 0..7 {
        clock.advance_secs(1);
        a.report("rlqs", acme(0)).unwrap();
        s.sweep();
        pushed = a.pending();
        if !pushed.is_empty() {
            break;
        }
    }
    assert_eq!(pushed.len(), 1);
    assert_eq!(pushed[0].assignment, Assignment::Abandon);
    assert_eq!(
        s.gauges(),
        RlqsTables {
            streams: 1,
            ..RlqsTables::default()
        }
    );
    assert_eq!(s.counters.abandoned.load(Ordering::Relaxed), 1);
}

#[test]
fn past_the_byte_budget_new_buckets_get_no_assignment() {
    let one =
        BUCKET_CHARGE + "rlqs_tenant_acme_".len() + holder_charge(&[Entry::new("tenant", "acme")]);
    let (s, _) = service(RlqsOptions {
        max_bytes: one,
        ..RlqsOptions::default()
    });
    let mut a = s.open();
    assert_eq!(a.report("rlqs", acme(1)).unwrap().len(), 1);
    assert_eq!(s.gauges().bytes, one);
    let mut b = s.open();
    assert!(b.report("rlqs", acme(1)).unwrap().is_empty());
    assert_eq!(s.counters.refused.load(Ordering::Relaxed), 1);
    // Blanket rules need no memory.
    let free = b
        .report("rlqs", vec![usage(&[("tenant", "free")], 1)])
        .unwrap();
    assert_eq!(free[0].assignment, Assignment::AllowAll);
}

#[test]
fn without_a_config_nothing_is_assigned() {
    let s = Arc::new(RlqsService::new(
        ConfigHandle::new(None),
        Arc::new(ManualClock::new(Timestamp::from_secs(1))),
        RlqsOptions::default(),
    ));
    assert!(s.open().report("rlqs", acme(1)).unwrap().is_empty());
}

#[test]
fn check_config_names_the_limits_no_bucket_can_reach() {
    let yaml = r#"
domain: rlqs
descriptors:
  - key: plan
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: tenant
    descriptors:
      - key: plan
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 1}
"#;
    let cfg = parse_files(&[("u.yaml".into(), yaml.into())], &LoadOptions::default()).unwrap();
    let found = unreachable_by_buckets(&cfg, &KeyOrder::default());
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(found[0].starts_with("rlqs.tenant.plan: no rate_limit_quota bucket reaches it: its keys are nested as tenant > plan, and a bucket's entries become a descriptor as plan > tenant"), "{found:#?}");
    assert!(found[1].starts_with("rlqs.tenant.tenant: no rate_limit_quota bucket reaches it: key \"tenant\" appears twice"), "{found:#?}");
    // With tenant first, the other nesting is the one no bucket reaches.
    let found = unreachable_by_buckets(&cfg, &KeyOrder::new(vec!["tenant".into()]));
    assert!(found[0].starts_with("rlqs.plan.tenant: "), "{found:#?}");
    assert!(
        unreachable_by_buckets(
            &parse_files(&[("q.yaml".into(), CONFIG.into())], &LoadOptions::default()).unwrap(),
            &KeyOrder::default()
        )
        .is_empty()
    );
}
