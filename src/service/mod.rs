//! The decision: turns a decoded [`Request`] into a [`Response`].
//!
//! This is where envoyproxy/ratelimit's semantics live: config matching (or the per-request
//! override), `replaces`, unlimited limits, hits addends, counter keys, shadow and quota modes,
//! the overall code and the `RateLimit-*` headers. It is protocol-free: `api` decodes into
//! [`Request`] and encodes [`Response`]; the store does the counting.

use std::fmt::Write as _;

use smallvec::SmallVec;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::config::{Block, ConfigHandle, Limit, Rule};
use crate::descriptor::{Entry, Request};
use crate::limiter::{Algorithm, Decision, Quota, Unit};
use crate::store::{CounterStore, Hit, StoreError};
use crate::telemetry::otlp::trace::{ActiveSpan, SpanKind, Value};
use crate::telemetry::otlp::{RequestTrace, Tracer, Transport};
use crate::telemetry::stats::{ErrorKind, Outcome};
use crate::telemetry::{LogLimiter, Stats};

/// The server span of a traced call: envoyproxy/ratelimit's name for it.
pub const SPAN_NAME: &str = "ShouldRateLimit Execution";

/// A descriptor's or the request's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    Ok,
    OverLimit,
}

/// The limit a status was decided against (`current_limit` on the wire).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CurrentLimit {
    pub requests_per_unit: u32,
    pub unit: Unit,
    pub name: String,
}

/// One descriptor's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    pub current_limit: Option<CurrentLimit>,
    pub limit_remaining: u32,
    pub duration_until_reset_secs: Option<u64>,
}

impl Status {
    /// `{code: OK}` and nothing else: no match, replaced, or unknown domain.
    pub const fn ok() -> Self {
        Status {
            code: Code::Ok,
            current_limit: None,
            limit_remaining: 0,
            duration_until_reset_secs: None,
        }
    }
    /// `{code: OK, limit_remaining: 4294967295}`.
    pub const fn unlimited() -> Self {
        Status {
            code: Code::Ok,
            current_limit: None,
            limit_remaining: u32::MAX,
            duration_until_reset_secs: None,
        }
    }
}

/// The answer to a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub overall_code: Code,
    /// One per request descriptor, in request order.
    pub statuses: Vec<Status>,
    /// What the `RateLimit-*` headers say, whether or not they are enabled (`/nginx` always
    /// sends them); `None` when no status has a current limit.
    pub rate_limit: Option<RateLimitHeaders>,
    /// `RateLimit-*` headers under their configured names, when enabled.
    pub response_headers: Vec<(String, String)>,
    /// RESPONSE_DYNAMIC_METADATA's struct, when enabled.
    pub dynamic_metadata: Option<serde_json::Value>,
}

/// Why a request got no decision.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ServiceError {
    #[error("rate limit domain must not be empty")]
    EmptyDomain,
    #[error("rate limit descriptor list must not be empty")]
    EmptyDescriptors,
    #[error("no rate limit configuration loaded")]
    NoConfig,
    #[error("request has {count} descriptors; the limit is {max} (SLUICE_MAX_DESCRIPTORS)")]
    TooManyDescriptors { count: usize, max: usize },
    #[error(
        "descriptor {index} has {count} entries; the limit is {max} entries per descriptor (SLUICE_MAX_ENTRIES)"
    )]
    TooManyEntries {
        index: usize,
        count: usize,
        max: usize,
    },
    #[error(
        "descriptor {index} makes a counter key of {bytes} bytes; the limit is {max} bytes (SLUICE_MAX_KEY_BYTES)"
    )]
    KeyTooLong {
        index: usize,
        bytes: usize,
        max: usize,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ServiceError {
    /// Errors the client caused by sending a request outside Sluice's caps. The Go service's
    /// own errors (empty domain, empty list, no config) are not in this class: it reports them
    /// as plain errors (gRPC UNKNOWN), and Envoy's filter is tuned to that.
    pub fn is_invalid_argument(&self) -> bool {
        matches!(
            self,
            ServiceError::TooManyDescriptors { .. }
                | ServiceError::TooManyEntries { .. }
                | ServiceError::KeyTooLong { .. }
        )
    }
}

/// Names of the `RateLimit-*` response headers (LIMIT_*_HEADER).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderNames {
    pub limit: String,
    pub remaining: String,
    pub reset: String,
}

impl Default for HeaderNames {
    fn default() -> Self {
        HeaderNames {
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        }
    }
}

/// The service-wide switches that shape every answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceOptions {
    /// SHADOW_MODE: an overall OVER_LIMIT is answered OK (statuses keep their codes).
    pub shadow_mode: bool,
    /// QUOTA_MODE: every limit behaves as if its YAML said `quota_mode: true`.
    pub quota_mode: bool,
    /// LIMIT_RESPONSE_HEADERS_ENABLED, with the header names.
    pub response_headers: Option<HeaderNames>,
    /// CACHE_KEY_PREFIX, prepended to every counter key.
    pub cache_key_prefix: String,
    /// RESPONSE_DYNAMIC_METADATA.
    pub dynamic_metadata: bool,
    /// SLUICE_BACKEND_FAILURE=allow: a backend failure answers OK instead of an error.
    pub fail_open: bool,
    /// SLUICE_FAIL_OPEN_DOMAINS: domains that fail open whatever `fail_open` says.
    pub fail_open_domains: Vec<String>,
    pub max_descriptors: usize,
    pub max_entries: usize,
    /// SLUICE_MAX_KEY_BYTES: the longest counter key a request may make (prefix included).
    pub max_key_bytes: usize,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        ServiceOptions {
            shadow_mode: false,
            quota_mode: false,
            response_headers: None,
            cache_key_prefix: String::new(),
            dynamic_metadata: false,
            fail_open: false,
            fail_open_domains: Vec::new(),
            max_descriptors: 64,
            max_entries: 32,
            max_key_bytes: 4096,
        }
    }
}

/// Writes envoyproxy/ratelimit's cache key stem for a descriptor:
/// `prefix + domain + "_" + Σ(key + "_" + value + "_")`. The Go service's full key appends the
/// window start in seconds (`..._1200`); the memory store keeps the window in the counter word
/// instead, and a Redis backend appends it. `shared_values` substitutes a `share_threshold`
/// wildcard pattern for the request's value at those entry indexes.
pub fn write_counter_key(
    buf: &mut String,
    prefix: &str,
    domain: &str,
    entries: &[Entry],
    shared_values: &[(usize, &str)],
) {
    buf.push_str(prefix);
    buf.push_str(domain);
    buf.push('_');
    for (i, entry) in entries.iter().enumerate() {
        buf.push_str(&entry.key);
        buf.push('_');
        buf.push_str(key_value(i, entry, shared_values));
        buf.push('_');
    }
}

/// The length of the stem [`write_counter_key`] writes, without writing it.
pub fn counter_key_len(
    prefix: &str,
    domain: &str,
    entries: &[Entry],
    shared_values: &[(usize, &str)],
) -> usize {
    let entries: usize = entries
        .iter()
        .enumerate()
        .map(|(i, e)| e.key.len() + key_value(i, e, shared_values).len() + 2)
        .sum();
    prefix.len() + domain.len() + 1 + entries
}

/// The value entry `i` puts in its counter key: the request's, or its shared pattern.
fn key_value<'a>(i: usize, entry: &'a Entry, shared_values: &[(usize, &'a str)]) -> &'a str {
    shared_values
        .iter()
        .find(|(at, _)| *at == i)
        .map_or(entry.value.as_str(), |(_, pattern)| pattern)
}

/// The length of `#<i>_`, which the `i`-th further quota of a `rate_limits` list adds to its
/// descriptor's stem.
fn quota_suffix_len(i: usize) -> usize {
    i.checked_ilog10().unwrap_or(0) as usize + 3
}

/// A limit that is counted: from config (`rule` is the matched limit, whose blocks give the
/// quotas) or from the request's override (`rule` is `None`: one fixed-window quota, no name,
/// no shadow mode, no replaces).
#[derive(Clone, Copy)]
struct Counted<'c> {
    rule: Option<&'c Limit>,
    overridden: Option<Quota>,
}

impl<'c> Counted<'c> {
    /// The quotas to enforce, each with its block name ("" for none).
    fn quotas(&self) -> impl Iterator<Item = (Quota, &'c str)> + '_ {
        let blocks: &'c [Block] = match self.rule.map(|l| &l.rule) {
            Some(Rule::Limited(blocks)) => blocks,
            _ => &[],
        };
        self.overridden
            .map(|q| (q, ""))
            .into_iter()
            .chain(blocks.iter().map(|b| (b.quota, b.name.as_str())))
    }
    fn shadow_mode(&self) -> bool {
        self.rule.is_some_and(|l| l.shadow_mode)
    }
    fn quota_mode(&self, global: bool) -> bool {
        global || self.rule.is_some_and(|l| l.quota_mode)
    }
    /// The name reported for a block: its own, else the limit's (`rate_limit.name`).
    fn name_for(&self, block_name: &'c str) -> &'c str {
        match (block_name, self.rule) {
            ("", Some(l)) => &l.name,
            (name, _) => name,
        }
    }
}

/// What one descriptor resolved to.
enum Plan<'c> {
    /// No match, or replaced: `{code: OK}`.
    Pass,
    Unlimited(&'c Limit),
    Counted {
        limit: Counted<'c>,
        /// `share_threshold` substitutions for the counter key.
        shared: Vec<(usize, &'c str)>,
        hits: u64,
    },
}

impl<'c> Plan<'c> {
    /// The matched config limit, if any (overrides have none).
    fn config_limit(&self) -> Option<&'c Limit> {
        match self {
            Plan::Pass => None,
            Plan::Unlimited(l) => Some(l),
            Plan::Counted { limit, .. } => limit.rule,
        }
    }
}

/// The rate-limit service core, generic over the counter store.
pub struct RateLimitService<S> {
    config: ConfigHandle,
    store: Arc<S>,
    clock: Arc<dyn Clock>,
    options: ServiceOptions,
    stats: Arc<Stats>,
    /// TRACING_ENABLED: spans of calls and of their backend calls.
    tracer: Arc<Tracer>,
    /// Backend failures can hit every request; they log at most once a second.
    backend_log: LogLimiter,
}

impl<S: CounterStore> RateLimitService<S> {
    pub fn new(
        config: ConfigHandle,
        store: Arc<S>,
        clock: Arc<dyn Clock>,
        options: ServiceOptions,
    ) -> Self {
        RateLimitService {
            config,
            store,
            clock,
            options,
            stats: Arc::new(Stats::default()),
            tracer: Arc::new(Tracer::disabled()),
            backend_log: LogLimiter::new(Duration::from_secs(1)),
        }
    }

    /// Records into `stats` (shared with the exporters) instead of a private registry.
    pub fn with_stats(mut self, stats: Arc<Stats>) -> Self {
        self.stats = stats;
        self
    }

    /// Records spans through `tracer` (tracing is off by default).
    pub fn with_tracer(mut self, tracer: Arc<Tracer>) -> Self {
        self.tracer = tracer;
        self
    }

    pub fn tracer(&self) -> &Arc<Tracer> {
        &self.tracer
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    pub fn config(&self) -> &ConfigHandle {
        &self.config
    }

    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    pub fn options(&self) -> &ServiceOptions {
        &self.options
    }

    fn check_caps(&self, request: &Request) -> Result<(), ServiceError> {
        if request.domain.is_empty() {
            return Err(ServiceError::EmptyDomain);
        }
        if request.descriptors.is_empty() {
            return Err(ServiceError::EmptyDescriptors);
        }
        let opts = &self.options;
        if request.descriptors.len() > opts.max_descriptors {
            return Err(ServiceError::TooManyDescriptors {
                count: request.descriptors.len(),
                max: opts.max_descriptors,
            });
        }
        match request
            .descriptors
            .iter()
            .position(|d| d.entries.len() > opts.max_entries)
        {
            Some(index) => Err(ServiceError::TooManyEntries {
                index,
                count: request.descriptors[index].entries.len(),
                max: opts.max_entries,
            }),
            None => Ok(()),
        }
    }

    /// The total length of the request's counter keys, once each is known to fit
    /// SLUICE_MAX_KEY_BYTES. Only descriptors that are counted make keys: one that matches no
    /// limit, an unlimited one or a replaced one answers OK whatever its size, as in the Go
    /// service, and costs nothing beyond the request (capped by SLUICE_MAX_REQUEST_BYTES).
    fn counter_key_bytes(
        &self,
        request: &Request,
        plans: &[Plan<'_>],
    ) -> Result<usize, ServiceError> {
        let max = self.options.max_key_bytes;
        let mut total = 0;
        for (index, (d, plan)) in request.descriptors.iter().zip(plans).enumerate() {
            let Plan::Counted { limit, shared, .. } = plan else {
                continue;
            };
            let prefix = &self.options.cache_key_prefix;
            let stem = counter_key_len(prefix, &request.domain, &d.entries, shared);
            let quotas = limit.quotas().count();
            // The last quota's key is the descriptor's longest.
            let bytes = stem + (1..quotas).last().map_or(0, quota_suffix_len);
            if bytes > max {
                return Err(ServiceError::KeyTooLong { index, bytes, max });
            }
            total += stem * quotas + (1..quotas).map(quota_suffix_len).sum::<usize>();
        }
        Ok(total)
    }

    /// `ShouldRateLimit`, with no caller trace context.
    pub async fn should_rate_limit(&self, request: Request) -> Result<Response, ServiceError> {
        self.should_rate_limit_traced(request, &RequestTrace::default())
            .await
    }

    /// `ShouldRateLimit`, continuing the caller's trace when `trace` carries one.
    pub async fn should_rate_limit_traced(
        &self,
        request: Request,
        trace: &RequestTrace,
    ) -> Result<Response, ServiceError> {
        let span = self.tracer.start(trace);
        if span.is_none() && !self.stats.enabled() {
            return self.decide(&request, None).await;
        }
        let started = Instant::now();
        let result = self.decide(&request, span.as_ref()).await;
        let error = match &result {
            Ok(_) => None,
            Err(ServiceError::Store(_)) => Some(ErrorKind::Backend),
            Err(_) => Some(ErrorKind::Service),
        };
        self.stats.request_done(started.elapsed(), error);
        if let Some(span) = span {
            self.end_span(span, trace.transport, &request, &result, error);
        }
        result
    }

    /// The call's SERVER span: what was asked and what was answered. Only sampled calls get
    /// here, so the allocations are theirs alone.
    fn end_span(
        &self,
        span: ActiveSpan,
        transport: Transport,
        request: &Request,
        result: &Result<Response, ServiceError>,
        error: Option<ErrorKind>,
    ) {
        let mut attributes = Vec::with_capacity(8);
        attributes.push(match transport {
            Transport::Grpc => ("rpc.system", Value::Static("grpc")),
            Transport::Json => ("http.route", Value::Static("/json")),
            Transport::Nginx => ("http.route", Value::Static("/nginx")),
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
        let message = match result {
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

    async fn decide(
        &self,
        request: &Request,
        span: Option<&ActiveSpan>,
    ) -> Result<Response, ServiceError> {
        self.check_caps(request)?;
        let guard = self.config.guard();
        let config = guard.as_ref().ok_or(ServiceError::NoConfig)?;
        let Some(domain) = config.domain(&request.domain) else {
            // An unknown domain is not an error in the Go service: every descriptor passes.
            self.stats.domain_not_found(&request.domain);
            let statuses = vec![Status::ok(); request.descriptors.len()];
            let quota = vec![false; statuses.len()];
            let metadata = self.dynamic_metadata(request, &[], &statuses);
            return Ok(self.finish(statuses, &quota, metadata));
        };

        // Resolve every descriptor: the override when present (it skips config matching),
        // else the config match.
        let request_hits = u64::from(request.hits_addend.max(1));
        let mut plans: SmallVec<[Plan<'_>; 4]> = request
            .descriptors
            .iter()
            .map(|d| {
                let hits = d.hits_addend.unwrap_or(request_hits);
                if let Some(o) = d.limit_override {
                    let limit = Counted {
                        rule: None,
                        overridden: Some(Quota::fixed(o.requests_per_unit, o.unit)),
                    };
                    let shared = Vec::new();
                    return Plan::Counted {
                        limit,
                        shared,
                        hits,
                    };
                }
                let Some(m) = domain.lookup(&d.entries) else {
                    return Plan::Pass;
                };
                match m.limit.rule {
                    Rule::Unlimited => Plan::Unlimited(m.limit),
                    Rule::Limited(_) => Plan::Counted {
                        limit: Counted {
                            rule: Some(m.limit),
                            overridden: None,
                        },
                        shared: m.shared_values,
                        hits,
                    },
                }
            })
            .collect();

        // `replaces`: the names listed by any matched limit (unlimited ones included) knock
        // out the matched limits of that name, which then answer `{code: OK}` uncounted.
        let replaced: Vec<&str> = plans
            .iter()
            .filter_map(Plan::config_limit)
            .flat_map(|l| l.replaces.iter().map(String::as_str))
            .collect();
        if !replaced.is_empty() {
            for plan in &mut plans {
                if plan
                    .config_limit()
                    .is_some_and(|l| l.names().any(|n| replaced.contains(&n)))
                {
                    *plan = Plan::Pass;
                }
            }
        }

        // One buffer holds every counter key of the request. The first quota of a descriptor
        // uses the Go service's key; further quotas of a `rate_limits` list add `#<index>_`.
        // Measured, and refused past SLUICE_MAX_KEY_BYTES, before anything is written.
        let key_bytes = self.counter_key_bytes(request, &plans)?;
        let mut keys = String::with_capacity(key_bytes);
        let mut ranges: SmallVec<[std::ops::Range<usize>; 4]> = SmallVec::new();
        for (d, plan) in request.descriptors.iter().zip(&plans) {
            if let Plan::Counted { limit, shared, .. } = plan {
                let start = keys.len();
                write_counter_key(
                    &mut keys,
                    &self.options.cache_key_prefix,
                    &request.domain,
                    &d.entries,
                    shared,
                );
                let stem = start..keys.len();
                ranges.push(stem.clone());
                for i in 1..limit.quotas().count() {
                    let start = keys.len();
                    keys.extend_from_within(stem.clone());
                    // Writing to a String cannot fail.
                    let _ = write!(keys, "#{i}_");
                    ranges.push(start..keys.len());
                }
            }
        }
        // Every counted descriptor is charged, even when another is already over (the Go
        // service does the same, so over-limit traffic keeps draining every counter).
        let hits: SmallVec<[Hit<'_>; 4]> = plans
            .iter()
            .filter_map(|p| match p {
                Plan::Counted { limit, hits, .. } => Some(limit.quotas().map(|(q, _)| (q, *hits))),
                _ => None,
            })
            .flatten()
            .zip(&ranges)
            .map(|((quota, hits), range)| Hit {
                key: &keys[range.clone()],
                quota,
                hits,
            })
            .collect();
        let mut decisions = Vec::with_capacity(hits.len());
        if !hits.is_empty() {
            // A traced call gets a CLIENT span around a backend that goes over the network.
            let child = span.and_then(|s| self.store.trace_backend().map(|b| (b, s.child())));
            let applied = self
                .store
                .apply(self.clock.now(), &hits, &mut decisions)
                .await;
            if let Some((backend, child)) = child {
                let mut attributes = Vec::with_capacity(backend.attributes.len() + 1);
                attributes.extend(
                    backend
                        .attributes
                        .iter()
                        .map(|(k, v)| (*k, Value::Static(v))),
                );
                attributes.push(("ratelimit.counters", Value::Int(hits.len() as i64)));
                let error = applied.as_ref().err().map(ToString::to_string);
                self.tracer.record(child.end(
                    backend.span_name,
                    SpanKind::Client,
                    attributes,
                    error,
                ));
            }
            if let Err(e) = applied {
                return self.backend_failed(request, e);
            }
        }
        if decisions.len() != hits.len() {
            return Err(StoreError::BadReply {
                expected: hits.len(),
                got: decisions.len(),
            }
            .into());
        }

        // A descriptor with several limits is refused as a whole when one of them refuses:
        // the limits that admitted it give the hits back (fixed windows excepted, which count
        // every hit as the Go service does), so a refused request consumes nothing.
        let mut refunds = Vec::new();
        let mut at = 0;
        for plan in &plans {
            if let Plan::Counted { limit, .. } = plan {
                let n = limit.quotas().count();
                let own = &decisions[at..at + n];
                if n > 1 && own.iter().any(|d| d.over) {
                    refunds.extend(
                        hits[at..at + n]
                            .iter()
                            .zip(own)
                            .filter(|(h, d)| !d.over && h.quota.algorithm != Algorithm::FixedWindow)
                            .map(|(h, _)| *h),
                    );
                }
                at += n;
            }
        }
        if !refunds.is_empty()
            && let Err(e) = self.store.refund(self.clock.now(), &refunds).await
        {
            // The decisions stand; only the give-back failed, so the request is answered.
            if let Some(suppressed) = self.backend_log.check() {
                tracing::warn!(
                    error = %e,
                    suppressed,
                    "could not give back hits of a refused request (at most one line a second)"
                );
            }
        }

        let mut decisions = decisions.iter();
        let mut statuses = Vec::with_capacity(plans.len());
        let mut quota: SmallVec<[bool; 8]> = SmallVec::new();
        for (plan, descriptor) in plans.iter().zip(&request.descriptors) {
            let (status, is_quota) = match plan {
                Plan::Pass => (Status::ok(), false),
                Plan::Unlimited(_) => (Status::unlimited(), false),
                Plan::Counted { limit, hits, .. } => {
                    let (status, chosen) = counted_status(limit, &mut decisions);
                    if let Some((quota, decision)) = chosen {
                        self.record_stats(
                            domain, request, descriptor, limit, *hits, quota, decision,
                        );
                    }
                    (status, limit.quota_mode(self.options.quota_mode))
                }
            };
            statuses.push(status);
            quota.push(is_quota);
        }
        let metadata = self.dynamic_metadata(request, &plans, &statuses);
        Ok(self.finish(statuses, &quota, metadata))
    }

    /// Adds one counted descriptor's decision to its limit's stats (reference §5). The key is
    /// the limit's `full_key` unless it depends on the request's values, which costs a lookup
    /// and an allocation only for such limits and for overrides.
    #[allow(clippy::too_many_arguments)]
    fn record_stats(
        &self,
        domain: &crate::config::Domain,
        request: &Request,
        descriptor: &crate::descriptor::Descriptor,
        limit: &Counted<'_>,
        hits: u64,
        quota: Quota,
        d: &Decision,
    ) {
        if !self.stats.enabled() {
            return;
        }
        let outcome = Outcome {
            hits,
            limit: quota.requests_per_unit,
            count_before: d.count_before,
            count_after: d.count_after,
            over: d.over,
            // The Redis store's local over-limit cache answers a fixed window without charging
            // it: the count does not move although hits were asked for.
            from_local_cache: quota.algorithm == Algorithm::FixedWindow
                && d.over
                && hits > 0
                && d.count_before == d.count_after,
            shadow_mode: limit.shadow_mode(),
        };
        match limit.rule {
            Some(l) if !l.stats_key_varies => {
                self.stats.record_static(&l.stats, &l.full_key, &outcome);
            }
            Some(_) => {
                if let Some(key) = domain.stats_key(&descriptor.entries) {
                    self.stats.record_dynamic(&key, &outcome);
                }
            }
            None => {
                // An override's stats key: `domain.k1_v1.k2_v2`.
                let mut key = String::with_capacity(64);
                key.push_str(&request.domain);
                for e in &descriptor.entries {
                    key.push('.');
                    key.push_str(&e.key);
                    key.push('_');
                    key.push_str(&e.value);
                }
                self.stats.record_dynamic(&key, &outcome);
            }
        }
    }

    /// Fail-open versus fail-closed is decided here: by default a backend failure is an error
    /// (gRPC UNKNOWN, as envoyproxy/ratelimit answers), which leaves the choice to Envoy's
    /// `failure_mode_deny`; the operator may instead fail open, globally or per domain, and
    /// then every descriptor answers `{code: OK}`.
    fn backend_failed(&self, request: &Request, e: StoreError) -> Result<Response, ServiceError> {
        let opts = &self.options;
        let fail_open = opts.fail_open || opts.fail_open_domains.contains(&request.domain);
        if let Some(suppressed) = self.backend_log.check() {
            tracing::warn!(
                domain = %request.domain,
                error = %e,
                fail_open,
                suppressed,
                "backend failed (at most one line a second; `suppressed` counts the failures not logged since the last line)"
            );
        }
        if fail_open {
            self.stats.backend_error();
            let statuses = vec![Status::ok(); request.descriptors.len()];
            let quota = vec![false; statuses.len()];
            return Ok(self.finish(statuses, &quota, None));
        }
        Err(e.into())
    }

    /// RESPONSE_DYNAMIC_METADATA: the request echoed back (domain, each descriptor's entries as
    /// `"k=v"`, its override and addend, the request's addend) plus a first-wins deep merge of the
    /// YAML `metadata` of the matched limits whose descriptor passed (answered OK).
    fn dynamic_metadata(
        &self,
        request: &Request,
        plans: &[Plan<'_>],
        statuses: &[Status],
    ) -> Option<serde_json::Value> {
        use serde_json::{Map, Value, json};
        if !self.options.dynamic_metadata {
            return None;
        }
        let descriptors = request
            .descriptors
            .iter()
            .map(|d| {
                let mut out = Map::new();
                let entries = d
                    .entries
                    .iter()
                    .map(|e| Value::from(format!("{}={}", e.key, e.value)))
                    .collect();
                out.insert("entries".into(), Value::Array(entries));
                if let Some(o) = d.limit_override {
                    out.insert(
                        "limit".into(),
                        json!({"requestsPerUnit": o.requests_per_unit, "unit": o.unit.name()}),
                    );
                }
                if let Some(h) = d.hits_addend {
                    out.insert("hitsAddend".into(), Value::from(h));
                }
                Value::Object(out)
            })
            .collect::<Vec<_>>();
        let mut metadata = Map::new();
        for (plan, status) in plans.iter().zip(statuses) {
            if status.code != Code::Ok {
                continue;
            }
            if let Some(Value::Object(m)) = plan.config_limit().and_then(|l| l.metadata.as_ref()) {
                merge_first_wins(&mut metadata, m);
            }
        }
        Some(json!({
            "domain": request.domain,
            "descriptors": descriptors,
            "hitsAddend": request.hits_addend,
            "metadata": metadata,
        }))
    }

    /// Overall code, global shadow mode and headers.
    fn finish(
        &self,
        statuses: Vec<Status>,
        quota: &[bool],
        dynamic_metadata: Option<serde_json::Value>,
    ) -> Response {
        let over = |i: usize| statuses[i].code == Code::OverLimit;
        let non_quota_over = (0..statuses.len()).any(|i| !quota[i] && over(i));
        let quota_count = quota.iter().filter(|q| **q).count();
        let all_quota_over = quota_count > 0 && (0..statuses.len()).all(|i| !quota[i] || over(i));
        let mut overall_code = if non_quota_over || all_quota_over {
            Code::OverLimit
        } else {
            Code::Ok
        };
        if self.options.shadow_mode && overall_code == Code::OverLimit {
            self.stats.global_shadow_mode();
            overall_code = Code::Ok;
        }
        let rate_limit = RateLimitHeaders::describing(&statuses, quota);
        let response_headers = match (&self.options.response_headers, &rate_limit) {
            (Some(names), Some(values)) => values.named(names),
            _ => Vec::new(),
        };
        Response {
            overall_code,
            statuses,
            rate_limit,
            response_headers,
            dynamic_metadata,
        }
    }
}

/// Adds `from` into `into`, keeping what `into` already has: maps merge recursively, any
/// other clash keeps the first value.
fn merge_first_wins(
    into: &mut serde_json::Map<String, serde_json::Value>,
    from: &serde_json::Map<String, serde_json::Value>,
) {
    use serde_json::Value;
    for (k, v) in from {
        match (into.get_mut(k), v) {
            (None, _) => {
                into.insert(k.clone(), v.clone());
            }
            (Some(Value::Object(a)), Value::Object(b)) => merge_first_wins(a, b),
            (Some(_), _) => {}
        }
    }
}

/// One descriptor's status from its quotas' decisions (taken from `decisions` in order): the
/// most restrictive one is reported, the first over-limit quota if any, else the one with the
/// least remaining.
fn counted_status<'d>(
    limit: &Counted<'_>,
    decisions: &mut impl Iterator<Item = &'d Decision>,
) -> (Status, Option<(Quota, &'d Decision)>) {
    let mut chosen: Option<(Quota, &str, &Decision)> = None;
    for ((quota, name), d) in limit.quotas().zip(decisions) {
        let better = match chosen {
            None => true,
            Some((_, _, c)) => {
                (d.over && !c.over) || (d.over == c.over && !c.over && d.remaining < c.remaining)
            }
        };
        if better {
            chosen = Some((quota, name, d));
        }
    }
    let Some((quota, name, d)) = chosen else {
        // Unreachable: every counted limit has a quota and the store answered each.
        return (Status::ok(), None);
    };
    // Per-rule shadow mode answers OK with remaining 0, while the counters keep counting.
    let code = if d.over && !limit.shadow_mode() {
        Code::OverLimit
    } else {
        Code::Ok
    };
    let status = Status {
        code,
        current_limit: Some(CurrentLimit {
            requests_per_unit: quota.requests_per_unit,
            unit: quota.unit,
            name: limit.name_for(name).to_owned(),
        }),
        limit_remaining: d.remaining,
        duration_until_reset_secs: Some(d.reset_after_secs),
    };
    (status, Some((quota, d)))
}

/// The values of the `RateLimit-*` headers: the limit, the remaining hits and the seconds to
/// the reset of the one status they describe. The one header rule of every adapter: gRPC and
/// `/json` send them under LIMIT_*_HEADER's names ([`RateLimitHeaders::named`]) when
/// LIMIT_RESPONSE_HEADERS_ENABLED is set, `/nginx` always under its fixed names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimitHeaders {
    pub limit: u32,
    pub remaining: u32,
    pub reset_secs: u64,
}

impl RateLimitHeaders {
    /// envoyproxy/ratelimit's choice (`shouldRateLimitWorker`): among the statuses with a
    /// current limit, the one with the least remaining (the first on a tie, and only below
    /// 4294967295), unless a non-quota descriptor is over, in which case the last such one.
    /// It is made from the statuses alone, before SHADOW_MODE turns the overall code to OK,
    /// and quota descriptors that are over never take the choice over.
    pub fn describing(statuses: &[Status], quota: &[bool]) -> Option<Self> {
        let last_non_quota_over = statuses
            .iter()
            .zip(quota)
            .rev()
            .find(|(s, q)| !**q && s.code == Code::OverLimit)
            .map(|(s, _)| s);
        let mut least: Option<&Status> = None;
        for s in statuses.iter().filter(|s| s.current_limit.is_some()) {
            let bound = least.map_or(u32::MAX, |c| c.limit_remaining);
            if s.limit_remaining < bound {
                least = Some(s);
            }
        }
        let s = last_non_quota_over.or(least)?;
        let limit = s.current_limit.as_ref()?;
        Some(RateLimitHeaders {
            limit: limit.requests_per_unit,
            remaining: s.limit_remaining,
            reset_secs: s.duration_until_reset_secs.unwrap_or(0),
        })
    }

    /// The headers under LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER and LIMIT_RESET_HEADER.
    pub fn named(&self, names: &HeaderNames) -> Vec<(String, String)> {
        vec![
            (names.limit.clone(), self.limit.to_string()),
            (names.remaining.clone(), self.remaining.to_string()),
            (names.reset.clone(), self.reset_secs.to_string()),
        ]
    }
}

#[cfg(test)]
mod tests;
