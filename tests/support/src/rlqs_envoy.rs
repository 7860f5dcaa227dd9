//! An Envoy's Rate Limit Quota Service stream, as the cluster and fault tests drive it: reports
//! one bucket's use and keeps the latest assignment the server pushed.

use std::sync::{Arc, Mutex};

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::Strategy;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Kind;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use tokio::sync::mpsc;

/// One Envoy's stream: its latest assignment for its bucket, in requests per second (0 for a
/// deny), kept up to date by a task reading the answers.
pub struct Envoy {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    rate: Arc<Mutex<Option<f64>>>,
    domain: String,
    bucket: Vec<(String, String)>,
}

impl Envoy {
    /// Opens a stream to `uri` (`http://host:port`) and reports `bucket` of `domain` once; an
    /// error when the server cannot be reached.
    pub async fn connect(
        uri: &str,
        domain: &str,
        bucket: &[(&str, &str)],
    ) -> Result<Envoy, String> {
        let mut client = RateLimitQuotaServiceClient::connect(uri.to_owned())
            .await
            .map_err(|e| format!("connect {uri}: {e}"))?;
        let (reports, rx) = mpsc::channel(8);
        let mut answers = client
            .stream_rate_limit_quotas(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .map_err(|e| format!("stream to {uri}: {e}"))?
            .into_inner();
        let rate = Arc::new(Mutex::new(None));
        let latest = rate.clone();
        tokio::spawn(async move {
            while let Ok(Some(answer)) = answers.message().await {
                for action in answer.bucket_action {
                    let Some(Kind::QuotaAssignmentAction(q)) = action.bucket_action else {
                        continue;
                    };
                    let r = match q.rate_limit_strategy.and_then(|s| s.strategy) {
                        Some(Strategy::TokenBucket(tb)) => {
                            f64::from(tb.tokens_per_fill.unwrap_or_default().value)
                                / tb.fill_interval.unwrap_or_default().seconds as f64
                        }
                        _ => 0.0,
                    };
                    *latest.lock().unwrap() = Some(r);
                }
            }
        });
        let envoy = Envoy {
            reports,
            rate,
            domain: domain.to_owned(),
            bucket: bucket
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        };
        envoy.report(1).await;
        Ok(envoy)
    }

    /// Reports `attempted` requests of the bucket since the last report.
    pub async fn report(&self, attempted: u64) {
        let usage = RateLimitQuotaUsageReports {
            domain: self.domain.clone(),
            bucket_quota_usages: vec![BucketQuotaUsage {
                bucket_id: Some(BucketId {
                    bucket: self.bucket.iter().cloned().collect(),
                }),
                time_elapsed: None,
                num_requests_allowed: attempted,
                num_requests_denied: 0,
            }],
        };
        self.reports.send(usage).await.expect("the stream is open");
    }

    /// The latest assignment, in requests per second; `None` before the first.
    pub fn rate(&self) -> Option<f64> {
        *self.rate.lock().unwrap()
    }
}
