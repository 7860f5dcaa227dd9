//! The Rate Limit Quota Service over a real gRPC socket, with tonic's client as Envoy's filter
//! would talk to it: assignments per bucket, the split across streams and its pushes, a dropped
//! stream's part freed after it expires, and reports the service refuses.

use std::time::Duration;

use sluice_test_support::app::{Running, config_from_yaml, default_options, start_with};
use sluice_test_support::http::http_async;
use sluice_test_support::process;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Kind;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const CONFIG: &str = r#"
domain: rlqs
descriptors:
  - key: tenant
    value: acme
    rate_limit: {unit: second, requests_per_unit: 100}
"#;

/// One open stream: reports go in through `tx`, answers come out of `rx`.
struct Stream {
    tx: mpsc::Sender<RateLimitQuotaUsageReports>,
    rx: tonic::Streaming<RateLimitQuotaResponse>,
}

async fn open(app: &Running) -> Stream {
    let mut client = RateLimitQuotaServiceClient::connect(format!("http://{}", app.grpc))
        .await
        .expect("connect");
    let (tx, reports) = mpsc::channel(8);
    let rx = client
        .stream_rate_limit_quotas(ReceiverStream::new(reports))
        .await
        .expect("stream opens")
        .into_inner();
    Stream { tx, rx }
}

fn bucket(pairs: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

fn report(domain: &str, buckets: &[(Option<BucketId>, u64)]) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: domain.into(),
        bucket_quota_usages: buckets
            .iter()
            .map(|(id, n)| BucketQuotaUsage {
                bucket_id: id.clone(),
                time_elapsed: None,
                num_requests_allowed: *n,
                num_requests_denied: 0,
            })
            .collect(),
    }
}

fn acme() -> Option<BucketId> {
    Some(bucket(&[("tenant", "acme")]))
}

impl Stream {
    async fn send(&self, r: RateLimitQuotaUsageReports) {
        self.tx.send(r).await.expect("stream open");
    }

    /// The next answer, within 5 s.
    async fn next(&mut self) -> Result<RateLimitQuotaResponse, tonic::Status> {
        match tokio::time::timeout(Duration::from_secs(5), self.rx.message()).await {
            Ok(Ok(Some(m))) => Ok(m),
            Ok(Ok(None)) => panic!("stream ended without a status"),
            Ok(Err(status)) => Err(status),
            Err(_) => panic!("no answer within 5 s"),
        }
    }
}

/// The requests per second of each action of an answer (`None`: allow all), with its TTL.
fn rates(r: &RateLimitQuotaResponse) -> Vec<(Option<f64>, i64)> {
    r.bucket_action
        .iter()
        .map(|a| match &a.bucket_action {
            Some(Kind::QuotaAssignmentAction(q)) => {
                let ttl = q.assignment_time_to_live.unwrap().seconds;
                let rate = match q.rate_limit_strategy.unwrap().strategy.unwrap() {
                    Strategy::BlanketRule(r) if r == BlanketRule::AllowAll as i32 => None,
                    Strategy::BlanketRule(_) => Some(0.0),
                    Strategy::TokenBucket(tb) => Some(
                        f64::from(tb.tokens_per_fill.unwrap().value)
                            / tb.fill_interval.unwrap().seconds as f64,
                    ),
                    Strategy::RequestsPerTimeUnit(_) => panic!("Envoy 1.39 ignores these"),
                };
                (rate, ttl)
            }
            other => panic!("not an assignment: {other:?}"),
        })
        .collect()
}

async fn start(ttl_secs: u64) -> Running {
    let mut options = default_options();
    options.quota.ttl = Duration::from_secs(ttl_secs);
    start_with(config_from_yaml(CONFIG), options).await
}

#[tokio::test]
async fn each_bucket_gets_an_assignment_and_unmatched_ones_allow_all() {
    let app = start(10).await;
    let mut s = open(&app).await;
    s.send(report(
        "rlqs",
        &[(acme(), 1), (Some(bucket(&[("tenant", "nobody")])), 1)],
    ))
    .await;
    let answer = s.next().await.unwrap();
    assert_eq!(rates(&answer), vec![(Some(100.0), 10), (None, 10)]);
    // Each action names its bucket as the Envoy sent it.
    assert_eq!(
        answer.bucket_action[1].bucket_id,
        Some(bucket(&[("tenant", "nobody")]))
    );
}

#[tokio::test]
async fn a_first_report_without_a_domain_ends_the_stream_with_invalid_argument() {
    let app = start(10).await;
    let mut s = open(&app).await;
    s.send(report("", &[(acme(), 1)])).await;
    let status = s.next().await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("domain"), "{status:?}");
}

#[tokio::test]
async fn a_malformed_bucket_is_skipped_and_the_stream_goes_on() {
    let app = start(10).await;
    let mut s = open(&app).await;
    s.send(report(
        "rlqs",
        &[(None, 1), (Some(bucket(&[])), 1), (acme(), 1)],
    ))
    .await;
    assert_eq!(rates(&s.next().await.unwrap()), vec![(Some(100.0), 10)]);
    s.send(report("", &[(acme(), 5)])).await;
    assert_eq!(rates(&s.next().await.unwrap()), vec![(Some(100.0), 10)]);
    let metrics = http_async(app.debug, "GET", "/metrics", "").await.body;
    assert!(
        metrics.contains("sluice_rlqs_malformed_total 2"),
        "{metrics}"
    );
}

#[tokio::test]
async fn two_streams_split_a_bucket_and_a_dropped_one_frees_its_part_once_expired() {
    let app = start(2).await;
    let mut a = open(&app).await;
    a.send(report("rlqs", &[(acme(), 1)])).await;
    // Until a second report measures the interval, it is taken to be Envoy's 5 s: a TTL of 10.
    assert_eq!(rates(&a.next().await.unwrap()), vec![(Some(100.0), 10)]);
    let mut b = open(&app).await;
    b.send(report("rlqs", &[(acme(), 1)])).await;
    assert_eq!(rates(&b.next().await.unwrap()), vec![(Some(50.0), 10)]);
    // a's part shrank: pushed to it without a report.
    assert_eq!(rates(&a.next().await.unwrap()), vec![(Some(50.0), 10)]);
    // Reports a second apart: assignments live 2 s (SLUICE_RLQS_ASSIGNMENT_TTL_SECS).
    app.clock.advance_secs(1);
    for s in [&mut a, &mut b] {
        s.send(report("", &[(acme(), 50)])).await;
        assert_eq!(rates(&s.next().await.unwrap()), vec![(Some(50.0), 2)]);
    }
    let debug = http_async(app.debug, "GET", "/debug/rlqs?key=rlqs_tenant_acme_", "").await;
    assert_eq!(debug.status, 200);
    let view: serde_json::Value = serde_json::from_str(&debug.body).unwrap();
    assert_eq!(view["assigned"], 100.0);
    assert_eq!(view["holders"].as_array().unwrap().len(), 2);

    drop(b);
    // b's part stays reserved while its Envoy may still enforce it (2 s), then goes to a.
    app.clock.advance_secs(1);
    a.send(report("rlqs", &[(acme(), 100)])).await;
    assert_eq!(rates(&a.next().await.unwrap()), vec![(Some(50.0), 2)]);
    app.clock.advance_secs(1);
    // The sweep runs every second.
    assert_eq!(rates(&a.next().await.unwrap()), vec![(Some(100.0), 2)]);
    let metrics = http_async(app.debug, "GET", "/metrics", "").await.body;
    for line in [
        "sluice_rlqs_streams 1",
        "sluice_rlqs_holders 1",
        "sluice_rlqs_expired_total 1",
        "sluice_rlqs_bucket_assigned{bucket=\"rlqs_tenant_acme_\"} 100",
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
    process::promtool_check(&metrics);
}

#[tokio::test]
async fn stopping_ends_every_stream_with_unavailable_and_the_drain_does_not_wait_for_them() {
    let mut app = start(10).await;
    let mut s = open(&app).await;
    s.send(report("rlqs", &[(acme(), 1)])).await;
    s.next().await.unwrap();
    let _ = app.shutdown.take().unwrap().send(());
    let status = s.next().await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    // The drain (5 s here) is not spent waiting for a stream that never ends by itself.
    tokio::time::timeout(Duration::from_secs(3), &mut app.task)
        .await
        .expect("stopped well within the drain timeout")
        .unwrap()
        .unwrap();
}
