//! The gRPC adapter of `envoy.service.rate_limit_quota.v3.RateLimitQuotaService`, for Envoy's
//! `rate_limit_quota` filter: decodes usage reports into [`crate::rlqs`]'s types and encodes its
//! actions as bucket actions. One task per stream answers each report at once and sends what
//! other streams' reports or the sweep pushed for it.
//!
//! A report naming no domain first, or another domain later, ends the stream with
//! INVALID_ARGUMENT; every stream ends with UNAVAILABLE when Sluice stops (Envoy keeps its
//! assignments and reconnects); a bucket that cannot be mapped (an empty or oversized id) is skipped and
//! counted, and the stream goes on. Messages past SLUICE_MAX_REQUEST_BYTES are refused by the
//! listener from their length prefix, as on ratelimit.v3.

use std::sync::Arc;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Kind, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::{Duration as ProtoDuration, UInt32Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::descriptor::Entry;
use crate::rlqs::{Action, Assignment, RlqsService, RlqsStream, StreamError, Usage};
use crate::telemetry::otlp::Tracer;
use crate::telemetry::otlp::trace::{ActiveSpan, SpanKind, Value};

type Reply = Result<RateLimitQuotaResponse, tonic::Status>;

/// The service, for the gRPC routes.
pub(crate) type Server = RateLimitQuotaServiceServer<GrpcQuota>;

/// The service over `service`; with tracing on (TRACING_ENABLED), each sampled stream is a span
/// `rlqs.stream` (its domain, reports and end) with a child `rlqs.report` per report.
pub(crate) fn server(
    service: Arc<RlqsService>,
    tracer: Arc<Tracer>,
    max_request_bytes: usize,
) -> Server {
    RateLimitQuotaServiceServer::new(GrpcQuota { service, tracer })
        .max_decoding_message_size(max_request_bytes)
}

pub(crate) struct GrpcQuota {
    service: Arc<RlqsService>,
    tracer: Arc<Tracer>,
}

#[tonic::async_trait]
impl RateLimitQuotaService for GrpcQuota {
    type StreamRateLimitQuotasStream = ReceiverStream<Reply>;

    async fn stream_rate_limit_quotas(
        &self,
        request: tonic::Request<tonic::Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<tonic::Response<Self::StreamRateLimitQuotasStream>, tonic::Status> {
        // A few answers queued at most: a stream that does not read stops being answered
        // until it does (its reports are not read meanwhile either).
        let trace = super::trace_context(
            self.tracer.enabled(),
            crate::telemetry::otlp::Transport::Grpc,
            request.metadata().as_ref(),
        );
        let spans = Spans {
            stream: self.tracer.start(&trace),
            tracer: self.tracer.clone(),
        };
        let (tx, rx) = mpsc::channel(4);
        let stream = self.service.open();
        tokio::spawn(serve_stream(stream, request.into_inner(), tx, spans));
        Ok(tonic::Response::new(ReceiverStream::new(rx)))
    }
}

/// A stream's span, when it is sampled.
struct Spans {
    stream: Option<ActiveSpan>,
    tracer: Arc<Tracer>,
}

impl Spans {
    /// Records a report's span, a child of the stream's.
    fn report(&self, buckets: usize, actions: Result<usize, &StreamError>) {
        let Some(parent) = &self.stream else { return };
        let span = parent.child();
        let mut attributes = vec![("rlqs.buckets", Value::Int(buckets as i64))];
        if let Ok(n) = actions {
            attributes.push(("rlqs.assignments", Value::Int(n as i64)));
        }
        let error = actions.err().map(ToString::to_string);
        self.tracer
            .record(span.end("rlqs.report", SpanKind::Internal, attributes, error));
    }

    fn end(self, stream: &RlqsStream, reports: i64, end: Option<&tonic::Status>) {
        let Some(span) = self.stream else { return };
        let attributes = vec![
            ("rpc.system", Value::Static("grpc")),
            (
                "rpc.service",
                Value::Static("envoy.service.rate_limit_quota.v3.RateLimitQuotaService"),
            ),
            ("rpc.method", Value::Static("StreamRateLimitQuotas")),
            (
                "domain",
                Value::Str(stream.domain().unwrap_or_default().to_owned()),
            ),
            ("rlqs.stream", Value::Int(stream.id() as i64)),
            ("rlqs.reports", Value::Int(reports)),
        ];
        let error = end.map(|s| format!("{:?}: {}", s.code(), s.message()));
        self.tracer
            .record(span.end("rlqs.stream", SpanKind::Server, attributes, error));
    }
}

/// Answers one stream's reports and sends its pushes, until either side ends it.
async fn serve_stream(
    mut stream: RlqsStream,
    mut reports: tonic::Streaming<RateLimitQuotaUsageReports>,
    tx: mpsc::Sender<Reply>,
    spans: Spans,
) {
    tracing::debug!(stream = stream.id(), "rlqs stream opened");
    let mut count = 0i64;
    let end = loop {
        let actions = tokio::select! {
            message = reports.message() => match message {
                Ok(Some(report)) => {
                    count += 1;
                    let (domain, usages) = usages_from_proto(report);
                    let buckets = usages.len();
                    let answered = stream.report(&domain, usages);
                    spans.report(buckets, answered.as_ref().map(Vec::len));
                    match answered {
                        Ok(actions) => actions,
                        Err(e) => break Some(tonic::Status::invalid_argument(e.to_string())),
                    }
                }
                Ok(None) => break None,
                Err(status) => break Some(status),
            },
            () = stream.woken() => stream.pending(),
            () = stream.closed() => break Some(tonic::Status::unavailable(
                "Sluice is shutting down: reconnect (to another replica)",
            )),
            () = tx.closed() => break None,
        };
        if actions.is_empty() {
            continue;
        }
        if tx.send(Ok(response_to_proto(actions))).await.is_err() {
            break None;
        }
    };
    tracing::debug!(
        stream = stream.id(),
        domain = stream.domain().unwrap_or_default(),
        status = ?end.as_ref().map(|s| s.code()),
        "rlqs stream ended"
    );
    spans.end(&stream, count, end.as_ref());
    if let Some(status) = end
        && matches!(
            status.code(),
            tonic::Code::InvalidArgument | tonic::Code::Unavailable
        )
    {
        let _ = tx.send(Err(status)).await;
    }
}

/// The report's domain and its buckets' usages; a usage without a bucket id keeps an empty id
/// (refused as malformed by the service, which counts it).
fn usages_from_proto(report: RateLimitQuotaUsageReports) -> (String, Vec<Usage>) {
    let usages = report
        .bucket_quota_usages
        .into_iter()
        .map(|u| Usage {
            id: u
                .bucket_id
                .map(|b| {
                    b.bucket
                        .into_iter()
                        .map(|(key, value)| Entry { key, value })
                        .collect()
                })
                .unwrap_or_default(),
            attempted: u.num_requests_allowed.saturating_add(u.num_requests_denied),
        })
        .collect();
    (report.domain, usages)
}

fn response_to_proto(actions: Vec<Action>) -> RateLimitQuotaResponse {
    RateLimitQuotaResponse {
        bucket_action: actions.into_iter().map(action_to_proto).collect(),
    }
}

fn action_to_proto(action: Action) -> BucketAction {
    let bucket_id = Some(BucketId {
        bucket: action
            .id
            .iter()
            .map(|e| (e.key.clone(), e.value.clone()))
            .collect(),
    });
    let strategy = match action.assignment {
        Assignment::Abandon => {
            return BucketAction {
                bucket_id,
                bucket_action: Some(Kind::AbandonAction(AbandonAction {})),
            };
        }
        Assignment::AllowAll => Strategy::BlanketRule(BlanketRule::AllowAll as i32),
        Assignment::DenyAll => Strategy::BlanketRule(BlanketRule::DenyAll as i32),
        Assignment::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_secs,
        } => Strategy::TokenBucket(TokenBucket {
            max_tokens,
            tokens_per_fill: Some(UInt32Value {
                value: tokens_per_fill,
            }),
            fill_interval: Some(seconds(fill_secs)),
        }),
    };
    BucketAction {
        bucket_id,
        bucket_action: Some(Kind::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(seconds(action.ttl_secs)),
            rate_limit_strategy: Some(RateLimitStrategy {
                strategy: Some(strategy),
            }),
        })),
    }
}

fn seconds(secs: u64) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(secs).unwrap_or(i64::MAX),
        nanos: 0,
    }
}
