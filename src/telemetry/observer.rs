//! The decision's observer: turns what [`crate::service`] reports into envoyproxy/ratelimit's
//! stats ([`Stats`]), the OTLP spans of `ShouldRateLimit` and its backend calls ([`Tracer`]),
//! and rate-limited logs. The span names and attributes are decided here, not in the service.

use std::sync::Arc;
use std::time::Duration;

use super::otlp::trace::{ActiveSpan, SpanKind, Value};
use super::otlp::{RequestTrace, Tracer, Transport};
use super::stats::{ErrorKind, KeySource};
use super::{KeyedLogLimiter, LogLimiter, Stats};
use crate::service::observe::{CallReport, Caller, DescriptorReport, Observer, Span, StatsKey};
use crate::service::{Code, ServiceError};
use crate::store::{StoreError, TraceBackend};

/// The server span of a traced call: envoyproxy/ratelimit's name for it.
pub(crate) const SPAN_NAME: &str = "ShouldRateLimit Execution";

/// Stats, spans and logs of a service's decisions.
pub struct DecisionTelemetry {
    stats: Arc<Stats>,
    /// TRACING_ENABLED: spans of calls and of their backend calls.
    tracer: Arc<Tracer>,
    /// Backend failures can hit every request; they log at most once a second.
    backend_log: LogLimiter,
    /// Refunds a limit does not take: once per limit per minute.
    negative_log: KeyedLogLimiter,
}

impl DecisionTelemetry {
    pub fn new(stats: Arc<Stats>, tracer: Arc<Tracer>) -> Self {
        DecisionTelemetry {
            stats,
            tracer,
            backend_log: LogLimiter::new(Duration::from_secs(1)),
            negative_log: KeyedLogLimiter::new(Duration::from_secs(60), 4096),
        }
    }

    /// Stats and logs, no spans (TRACING_ENABLED off).
    pub fn untraced(stats: Arc<Stats>) -> Self {
        DecisionTelemetry::new(stats, Arc::new(Tracer::disabled()))
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    pub fn tracer(&self) -> &Arc<Tracer> {
        &self.tracer
    }
}

/// The caller's trace context as the adapter decoded it; a call without one (a direct
/// `should_rate_limit`) is a gRPC call with no parent.
fn request_trace<'a>(caller: Caller<'a>) -> &'a RequestTrace {
    static NONE: RequestTrace = RequestTrace {
        transport: Transport::Grpc,
        parent: None,
    };
    caller.downcast_ref::<RequestTrace>().unwrap_or(&NONE)
}

fn active(span: Span) -> Option<ActiveSpan> {
    span.0.downcast::<ActiveSpan>().ok().map(|s| *s)
}

/// How the Go service counts a failed call.
fn error_kind(result: &Result<crate::service::Response, ServiceError>) -> Option<ErrorKind> {
    match result {
        Ok(_) => None,
        Err(ServiceError::Store(_)) => Some(ErrorKind::Backend),
        Err(_) => Some(ErrorKind::Service),
    }
}

impl DecisionTelemetry {
    /// The call's SERVER span: what was asked and what was answered. Only sampled calls get
    /// here, so the allocations are theirs alone.
    fn end_span(&self, span: ActiveSpan, call: &CallReport<'_>, error: Option<ErrorKind>) {
        let request = call.request;
        let mut attributes = Vec::with_capacity(8);
        attributes.push(match request_trace(call.caller).transport {
            Transport::Grpc => ("rpc.system", Value::Static("grpc")),
            Transport::Json => ("http.route", Value::Static("/json")),
            Transport::Nginx => ("http.route", Value::Static("/nginx")),
            Transport::ForwardAuth => ("http.route", Value::Static("/forward-auth")),
            Transport::Spoa => ("rpc.system", Value::Static("spop")),
        });
        attributes.push((
            "rpc.service",
            Value::Static("envoy.service.ratelimit.v3.RateLimitService"),
        ));
        attributes.push(("rpc.method", Value::Static("ShouldRateLimit")));
        attributes.push(("domain", Value::Str(request.domain.clone())));
        attributes.push((
            "ratelimit.descriptors",
            Value::Int(request.descriptors.len() as i64),
        ));
        attributes.push((
            "ratelimit.hits_addend",
            Value::Int(i64::from(request.hits_addend)),
        ));
        let message = match call.result {
            Ok(r) => {
                let code = match r.overall_code {
                    Code::Ok => "OK",
                    Code::OverLimit => "OVER_LIMIT",
                };
                attributes.push(("ratelimit.overall_code", Value::Static(code)));
                None
            }
            Err(e) => {
                let kind = match error {
                    Some(ErrorKind::Backend) => "redis_error",
                    _ => "service_error",
                };
                attributes.push(("error.type", Value::Static(kind)));
                Some(e.to_string())
            }
        };
        self.tracer
            .record(span.end(SPAN_NAME, SpanKind::Server, attributes, message));
    }
}

impl Observer for DecisionTelemetry {
    fn traces(&self) -> bool {
        self.tracer.enabled()
    }

    fn counts(&self) -> bool {
        self.stats.enabled()
    }

    fn call_started(&self, caller: Caller<'_>) -> Option<Span> {
        let span = self.tracer.start(request_trace(caller))?;
        Some(Span(Box::new(span)))
    }

    fn call_done(&self, call: &CallReport<'_>, span: Option<Span>) {
        let error = error_kind(call.result);
        self.stats.request_done(call.elapsed, error);
        if let Some(span) = span.and_then(active) {
            self.end_span(span, call, error);
        }
    }

    fn backend_started(&self, call: &Span) -> Option<Span> {
        let parent = call.0.downcast_ref::<ActiveSpan>()?;
        Some(Span(Box::new(parent.child())))
    }

    /// The CLIENT span around a backend that goes over the network.
    fn backend_done(
        &self,
        span: Span,
        backend: TraceBackend,
        counters: usize,
        error: Option<&StoreError>,
    ) {
        let Some(span) = active(span) else { return };
        let mut attributes = Vec::with_capacity(backend.attributes.len() + 1);
        attributes.extend(
            backend
                .attributes
                .iter()
                .map(|(k, v)| (*k, Value::Static(v))),
        );
        attributes.push(("ratelimit.counters", Value::Int(counters as i64)));
        let error = error.map(ToString::to_string);
        self.tracer
            .record(span.end(backend.span_name, SpanKind::Client, attributes, error));
    }

    fn domain_not_found(&self, domain: &str) {
        self.stats.domain_not_found(domain);
    }

    fn descriptor_decided(&self, report: &DescriptorReport<'_>) {
        let outcome = &report.outcome;
        match report.key {
            StatsKey::Limit { slot, full_key } => {
                self.stats.record_static(slot, full_key, outcome);
            }
            StatsKey::Values { key, limit } => {
                self.stats
                    .record_dynamic(key, KeySource::Limit(limit), outcome);
            }
            StatsKey::Override { key, unit } => {
                self.stats
                    .record_dynamic(key, KeySource::Override(unit), outcome);
            }
        }
    }

    fn backend_failed(&self, domain: &str, error: &StoreError, fail_open: bool) {
        if let Some(suppressed) = self.backend_log.check() {
            tracing::warn!(
                domain = %domain,
                error = %Chain(error),
                fail_open,
                suppressed,
                "backend failed (at most one line a second; `suppressed` counts the failures not logged since the last line)"
            );
        }
        if fail_open {
            self.stats.backend_error();
        }
    }

    fn refund_failed(&self, error: &StoreError) {
        if let Some(suppressed) = self.backend_log.check() {
            tracing::warn!(
                error = %Chain(error),
                suppressed,
                "could not give back hits of a refused request (at most one line a second)"
            );
        }
    }

    fn negative_hits_ignored(&self, limit: &str) {
        if let Some(suppressed) = self.negative_log.check(limit) {
            tracing::warn!(
                limit = %limit,
                suppressed,
                "negative hits (is_negative_hits) not taken off: a limit of this descriptor does \
                 not count refused hits, and Envoy sends the refund for refused requests too, so \
                 applying it could give back capacity a request never took; set \
                 `charge_refused: true` on the limit to apply them (see docs/algorithms.md, \
                 Refunds; SLUICE_NEGATIVE_HITS=always applies every one, as envoyproxy/ratelimit \
                 does). At most one line per limit a minute."
            );
        }
    }

    fn global_shadow_mode(&self) {
        self.stats.global_shadow_mode();
    }

    fn reservations(&self, opened: u64, settled: u64, late: u64) {
        self.stats.reservations(opened, settled, late);
    }
}

/// An error and its sources, `outer: inner: ...`, so a log line says why a peer failed (a
/// [`StoreError::Peer`]'s source is the `PeerError`: a timeout, a refusal, a malformed answer).
struct Chain<'a>(&'a StoreError);

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = std::error::Error::source(self.0);
        while let Some(e) = source {
            write!(f, ": {e}")?;
            source = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Cause;

    #[test]
    fn a_logged_store_error_names_its_cause() {
        let timeout = std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer within 50ms");
        let error = StoreError::Peer {
            message: "the owners of some counters did not answer",
            source: Cause::new(timeout),
        };
        assert_eq!(
            Chain(&error).to_string(),
            format!("{error}: no answer within 50ms")
        );
        let full = StoreError::BadReply {
            expected: 2,
            got: 1,
        };
        assert_eq!(Chain(&full).to_string(), full.to_string());
    }
}
