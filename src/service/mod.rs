//! The decision: turns a decoded [`Request`] into a [`Response`].
//!
//! This is where envoyproxy/ratelimit's semantics live: config matching (or the per-request
//! override), `replaces`, unlimited limits, hits addends, which counter keys a request makes
//! (their bytes are [`crate::key`]'s), shadow and quota modes,
//! the overall code and the `RateLimit-*` headers (for the client's answer and for the upstream
//! request). It is protocol-free: `api` decodes into [`Request`] and encodes [`Response`]; the
//! store does the counting.
//!
//! `RateLimitService::decide` reads as its steps: resolve each descriptor to a plan and
//! apply `replaces` (`plan.rs`), build the counter keys and hits, charge the store, give back
//! what a refused request's other limits admitted, make the statuses, the dynamic metadata and
//! the headers. What it reports (stats, spans, logs) goes to an [`observe::Observer`]; time
//! comes from the injected [`Clock`], read once when the decision starts and, when stats are
//! on, once when it ends.

mod admin;
mod hot;
pub(crate) mod observe;
mod plan;
mod reserve;

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use crate::clock::{Clock, Timestamp};
use crate::config::{ConfigHandle, Domain};
use crate::descriptor::{Descriptor, Request};
use crate::limiter::{Algorithm, Decision, Quota, Unit};
use crate::store::{CounterStore, Hit, StoreError};
pub(crate) use admin::{CounterView, counter_json};
pub(crate) use hot::HotKeys;
use observe::{
    CallReport, Caller, DescriptorReport, Observer, Outcome, SlotChanges, Span, StatsKey,
    Unobserved,
};
use plan::{Counted, Plan, overall_code};
pub(crate) use reserve::RESERVATION;
pub use reserve::RESERVE;

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

/// A response's statuses. A `Vec`, the one allocation a decision keeps: inline (`SmallVec`) the
/// answer grows by the statuses' size and every move of it through the decision's futures
/// copies them, measured to cost more than the allocation (docs/benchmarks.md).
pub(crate) type Statuses = Vec<Status>;

/// The answer to a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub overall_code: Code,
    /// One per request descriptor, in request order.
    pub statuses: Statuses,
    /// What the `RateLimit-*` headers say, whether or not they are enabled (`/nginx` always
    /// sends them); `None` when no status has a current limit.
    pub rate_limit: Option<RateLimitHeaders>,
    /// `response_headers_to_add`: the `RateLimit-*` headers under their configured names
    /// (LIMIT_RESPONSE_HEADERS_ENABLED, when `rate_limit` is set), or every status's per-unit
    /// headers (LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED).
    pub response_headers: Option<ResponseHeaders>,
    /// `request_headers_to_add`, for the upstream: the same values as `rate_limit` under
    /// LIMIT_REQUEST_*_HEADER's names, when LIMIT_REQUEST_HEADERS_ENABLED and `rate_limit` is set.
    pub request_headers: Option<NamedHeaders>,
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
    #[error(
        "descriptor {index}: bad reservation {token:?} (sluice_reservation carries the token an answer's dynamic metadata gave, `<ms>.<hits>`, and a descriptor carries at most one of sluice_reserve and sluice_reservation)"
    )]
    BadReservation { index: usize, token: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ServiceError {
    /// Errors the client caused by sending a request outside Sluice's caps. The Go service's
    /// own errors (empty domain, empty list, no config) are not in this class: it reports them
    /// as plain errors (gRPC UNKNOWN), and Envoy's filter is tuned to that.
    pub(crate) fn is_invalid_argument(&self) -> bool {
        matches!(
            self,
            ServiceError::TooManyDescriptors { .. }
                | ServiceError::TooManyEntries { .. }
                | ServiceError::KeyTooLong { .. }
                | ServiceError::BadReservation { .. }
        )
    }
}

/// Names of the `RateLimit-*` headers: LIMIT_*_HEADER for the client's answer,
/// LIMIT_REQUEST_*_HEADER for the upstream request. Both default to the same names.
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
    /// LIMIT_REQUEST_HEADERS_ENABLED, with the header names: the same values, in
    /// `request_headers_to_add`, which Envoy adds to the request it lets through.
    pub request_headers: Option<HeaderNames>,
    /// LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED: `response_headers_to_add` has a limit and a
    /// remaining header per status, named after its unit, instead of `response_headers`' three.
    pub all_descriptors_headers: bool,
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
    /// SLUICE_NEGATIVE_HITS: which refunds (`is_negative_hits`) are applied.
    pub negative_hits: NegativeHits,
}

/// SLUICE_NEGATIVE_HITS: which negative hits (`is_negative_hits`: a descriptor's hits taken
/// off its counters, what Envoy sends at a request's end to count requests in flight) are
/// applied. Envoy sends the refund for a request it refused too; a limit that did not count
/// the refused hit would be given back capacity the request never took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NegativeHits {
    /// `counted` (the default): on a limit whose store counts its refused hits
    /// ([`CounterStore::counts_refused`]: a fixed window, as the Go service counts, or any
    /// limit with `charge_refused: true`); on the others the refund is answered OK, counted as
    /// ignored and logged, and takes nothing off.
    #[default]
    Counted,
    /// `always`: on every limit, as envoyproxy/ratelimit does.
    Always,
}

impl NegativeHits {
    /// The setting's spelling.
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        match name {
            "counted" => Some(NegativeHits::Counted),
            "always" => Some(NegativeHits::Always),
            _ => None,
        }
    }
}

impl Default for ServiceOptions {
    fn default() -> Self {
        ServiceOptions {
            shadow_mode: false,
            quota_mode: false,
            response_headers: None,
            request_headers: None,
            all_descriptors_headers: false,
            cache_key_prefix: String::new(),
            dynamic_metadata: false,
            fail_open: false,
            fail_open_domains: Vec::new(),
            max_descriptors: 64,
            max_entries: 32,
            max_key_bytes: 4096,
            negative_hits: NegativeHits::Counted,
        }
    }
}

/// The rate-limit service core, generic over the counter store.
pub struct RateLimitService<S> {
    config: ConfigHandle,
    store: Arc<S>,
    clock: Arc<dyn Clock>,
    options: ServiceOptions,
    /// `options.response_headers`, shared with every answer that sends them.
    header_names: Option<Arc<HeaderNames>>,
    /// `options.request_headers`, the same way.
    request_header_names: Option<Arc<HeaderNames>>,
    /// What the decisions report to (telemetry); by default nothing.
    observer: Arc<dyn Observer>,
    /// The counters closest to or over their limits, for the status page.
    hot: Arc<HotKeys>,
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
            header_names: options.response_headers.clone().map(Arc::new),
            request_header_names: options.request_headers.clone().map(Arc::new),
            options,
            observer: Arc::new(Unobserved),
            hot: Arc::default(),
        }
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The counters closest to or over their limits right now ([`HotKeys`]).
    pub(crate) fn hot_keys(&self) -> &Arc<HotKeys> {
        &self.hot
    }

    /// Reports decisions to `observer` (stats, spans, logs).
    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = observer;
        self
    }

    pub(crate) fn observer(&self) -> &Arc<dyn Observer> {
        &self.observer
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

    /// `ShouldRateLimit`, with no caller context.
    pub async fn should_rate_limit(&self, request: Request) -> Result<Response, ServiceError> {
        self.should_rate_limit_traced(request, &()).await
    }

    /// `ShouldRateLimit`, with the context the adapter decoded for the observer (the caller's
    /// trace context, which a traced call continues).
    pub async fn should_rate_limit_traced(
        &self,
        request: Request,
        caller: Caller<'_>,
    ) -> Result<Response, ServiceError> {
        let span = self.observer.call_started(caller);
        let started = self.clock.now_nanos();
        let now = Timestamp::from_nanos(started);
        if span.is_none() && !self.observer.counts() {
            return self.decide(&request, now, None).await;
        }
        let result = self.decide(&request, now, span.as_ref()).await;
        let call = CallReport {
            caller,
            request: &request,
            result: &result,
            elapsed: Duration::from_nanos(self.clock.now_nanos().saturating_sub(started)),
        };
        self.observer.call_done(&call, span);
        result
    }

    /// The decision, step by step, at `now`. `call` is the call's span when it is traced.
    async fn decide(
        &self,
        request: &Request,
        now: Timestamp,
        call: Option<&Span>,
    ) -> Result<Response, ServiceError> {
        self.check_caps(request)?;
        let reservations = reserve::split(request)?;
        let request = reservations.as_ref().map_or(request, |r| &r.request);
        let guard = self.config.guard();
        let config = guard.as_ref().ok_or(ServiceError::NoConfig)?;
        let Some(domain) = config.domain(&request.domain) else {
            return Ok(self.unknown_domain(request));
        };
        let mut plans = plan::plan(domain, request);
        plan::apply_replaces(&mut plans);
        let mut scratch = Scratch::take();
        let Buffers { keys, decisions } = &mut scratch.0;
        let keys = plan::counter_keys(&self.options, request, &plans, keys)?;
        let hits = plan::hits(&plans, &keys);
        let refunds = plans.iter().any(Plan::is_negative);
        let charged = if refunds {
            self.charge_and_refund(now, &plans, &hits, call, decisions)
                .await
        } else {
            self.charge(now, &hits, call, decisions).await
        };
        if let Err(e) = charged {
            return self.backend_failed(request, e);
        }
        let decisions = decisions.as_slice();
        if decisions.len() != hits.len() {
            let (expected, got) = (hits.len(), decisions.len());
            return Err(StoreError::BadReply { expected, got }.into());
        }
        let negative = refunds.then(|| plan::negative_mask(&plans));
        for (i, (hit, d)) in hits.iter().zip(decisions).enumerate() {
            let refund = negative.as_ref().is_some_and(|m| m[i]);
            if hit.hits > 0 && !refund {
                self.hot.record(hit.key, &hit.quota, d, now);
            }
        }
        self.give_back(now, &plan::refunds(&plans, &hits, decisions))
            .await;
        let (statuses, quota) = self.outcome(domain, request, &plans, decisions, true);
        let metadata = self.dynamic_metadata(request, &plans, &statuses);
        let mut response = self.finish(statuses, &quota, metadata);
        if let Some(r) = &reservations {
            let charged = (plans.as_slice(), hits.as_slice(), decisions);
            self.reservations(r, now, charged, &mut response).await;
        }
        Ok(response)
    }

    /// A request's reservations once it is decided ([`reserve`]): each settle gives back what
    /// its estimate passed its cost, at the instant it reserved, and charges a cost past it
    /// now; an admitted request's answer names its reservation in the dynamic metadata, and a
    /// refused one gives back what its reserving descriptors' counters kept.
    async fn reservations(
        &self,
        r: &reserve::Reservations,
        now: Timestamp,
        (plans, hits, decisions): (&[Plan<'_>], &[Hit<'_>], &[Decision]),
        response: &mut Response,
    ) {
        let (back, over) = reserve::settlements(r, plans, hits);
        for (at, hit) in back {
            self.give_back(at, &[hit]).await;
        }
        let settled = reserve::twins(r, plans, hits, None);
        for (twin, hit) in settled.iter().zip(reserve::twin_hits(&settled)) {
            self.give_back(twin.0.unwrap_or(now), &[hit]).await;
        }
        let (settles, late) = reserve::settled(r, plans, hits, now);
        let opened = match response.overall_code {
            Code::OverLimit => 0,
            _ => r
                .roles
                .iter()
                .filter(|role| **role == reserve::Role::Reserve)
                .count() as u64,
        };
        self.observer.reservations(opened, settles, late);
        if !over.is_empty() {
            // Charged, never refused: the request has run. Its decisions are not needed.
            if let Err(e) = self.store.apply(now, &over, &mut Vec::new()).await {
                self.observer.refund_failed(&e);
            }
        }
        if !r.reserves() {
            return;
        }
        if response.overall_code == Code::OverLimit {
            self.give_back(now, &reserve::refused(r, plans, hits, decisions))
                .await;
            return;
        }
        let reserved = reserve::reserved_hits(r, plans);
        let twins = reserve::twins(r, plans, hits, Some(reserved));
        if !twins.is_empty() {
            let twin_hits = reserve::twin_hits(&twins);
            if let Err(e) = self.store.apply(now, &twin_hits, &mut Vec::new()).await {
                self.observer.refund_failed(&e);
            }
        }
        let token = reserve::token(now, reserved);
        let metadata = response
            .dynamic_metadata
            .get_or_insert_with(|| serde_json::json!({}));
        if let Some(m) = metadata.as_object_mut() {
            m.insert(RESERVATION.into(), token.into());
        }
    }

    /// An unknown domain is not an error in the Go service: every descriptor passes.
    fn unknown_domain(&self, request: &Request) -> Response {
        self.observer.domain_not_found(&request.domain);
        let statuses = all_ok(request);
        let quota: SmallVec<[bool; 8]> = smallvec::smallvec![false; statuses.len()];
        let metadata = self.dynamic_metadata(request, &[], &statuses);
        self.finish(statuses, &quota, metadata)
    }

    /// Charges every hit at `now`, the decisions into `decisions` (cleared first);
    /// a traced call reports the backend call as a span of its own when the store goes over
    /// the network.
    async fn charge(
        &self,
        now: Timestamp,
        hits: &[Hit<'_>],
        call: Option<&Span>,
        decisions: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        decisions.clear();
        if hits.is_empty() {
            return Ok(());
        }
        decisions.reserve(hits.len());
        let backend = call.and_then(|c| {
            let traced = self.store.trace_backend()?;
            Some((traced, self.observer.backend_started(c)?))
        });
        let applied = self.store.apply(now, hits, decisions).await;
        if let Some((traced, span)) = backend {
            let error = applied.as_ref().err();
            self.observer.backend_done(span, traced, hits.len(), error);
        }
        applied
    }

    /// A request with negative descriptors: the other hits charged as usual, the negative ones
    /// refunded (the ones [`RateLimitService::applies_refund`] lets through; the others
    /// refund 0 hits, a peek), and the decisions put back in the hits' order into `decisions`.
    async fn charge_and_refund(
        &self,
        now: Timestamp,
        plans: &[Plan<'_>],
        hits: &[Hit<'_>],
        call: Option<&Span>,
        decisions: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        let mask = plan::negative_mask(plans);
        let (mut charges, mut refunds) = (Vec::new(), Vec::new());
        for (hit, &negative) in hits.iter().zip(&mask) {
            if negative {
                let applied = self.applies_refund(&hit.quota);
                refunds.push(Hit {
                    hits: if applied { hit.hits } else { 0 },
                    ..*hit
                });
            } else {
                charges.push(*hit);
            }
        }
        self.charge(now, &charges, call, decisions).await?;
        let mut refunded = Vec::with_capacity(refunds.len());
        if !refunds.is_empty() {
            self.store.refund(now, &refunds, &mut refunded).await?;
        }
        let (expected, got) = (hits.len(), decisions.len() + refunded.len());
        if got != expected || refunded.len() != refunds.len() {
            return Err(StoreError::BadReply { expected, got });
        }
        let charged: SmallVec<[Decision; 4]> = decisions.drain(..).collect();
        let (mut charged, mut refunded) = (charged.into_iter(), refunded.into_iter());
        for negative in mask {
            let next = if negative {
                refunded.next()
            } else {
                charged.next()
            };
            decisions.extend(next);
        }
        Ok(())
    }

    /// Whether a negative hit on `quota` is taken off its counter (SLUICE_NEGATIVE_HITS).
    fn applies_refund(&self, quota: &Quota) -> bool {
        if quota.takes_every_refund() {
            return true;
        }
        match self.options.negative_hits {
            NegativeHits::Always => true,
            // A penalty refuses hits without counting them (`penalty_seconds`), so a refund
            // sent for a refused request may give back what it never took.
            NegativeHits::Counted => self.store.counts_refused(quota) && quota.penalty.is_none(),
        }
    }

    /// Gives back what a refused request's other limits admitted, at `now`, the time they were
    /// charged at, so a refund reaches the window it was charged to even when one ended since.
    /// The decisions stand; when only the give-back fails, the request is still answered.
    async fn give_back(&self, now: Timestamp, refunds: &[Hit<'_>]) {
        if refunds.is_empty() {
            return;
        }
        // The answers to a give-back are not needed: the decisions stand.
        let mut answers = Vec::new();
        if let Err(e) = self.store.refund(now, refunds, &mut answers).await {
            self.observer.refund_failed(&e);
        }
    }

    /// Each descriptor's status, and whether it is in quota mode; with `report`, each counted
    /// descriptor's decision is reported to the observer.
    fn outcome(
        &self,
        domain: &Domain,
        request: &Request,
        plans: &[Plan<'_>],
        decisions: &[Decision],
        report: bool,
    ) -> (Statuses, SmallVec<[bool; 8]>) {
        let mut decisions = decisions.iter();
        let mut statuses = statuses_for(plans.len());
        let mut quota = SmallVec::new();
        for (plan, descriptor) in plans.iter().zip(&request.descriptors) {
            let (status, is_quota) = match plan {
                Plan::Pass => (Status::ok(), false),
                Plan::Unlimited(_) => (Status::unlimited(), false),
                Plan::Counted {
                    limit,
                    hits,
                    negative,
                    ..
                } => {
                    let (status, chosen) = counted_status(limit, *negative, &mut decisions);
                    if let Some((quota, decision)) = chosen.filter(|_| report) {
                        let refund = self.refund_outcome(request, descriptor, limit, *negative);
                        let counted = (limit, *hits, quota, decision);
                        self.report_descriptor(domain, request, descriptor, counted, refund);
                    }
                    (status, limit.quota_mode(self.options.quota_mode))
                }
            };
            statuses.push(status);
            quota.push(is_quota);
        }
        (statuses, quota)
    }

    /// A counted descriptor's refund, as reported: `(negative, ignored)`. A refund some limit
    /// of the descriptor did not take (SLUICE_NEGATIVE_HITS) is reported to the observer for
    /// its log, whether or not it counts.
    fn refund_outcome(
        &self,
        request: &Request,
        descriptor: &Descriptor,
        limit: &Counted<'_>,
        negative: bool,
    ) -> (bool, bool) {
        if !negative {
            return (false, false);
        }
        let ignored = limit.quotas().any(|(q, _)| !self.applies_refund(&q));
        if ignored {
            match limit.rule {
                Some(l) => self.observer.negative_hits_ignored(&l.full_key),
                None => self
                    .observer
                    .negative_hits_ignored(&override_stats_key(request, descriptor)),
            }
        }
        (true, ignored)
    }

    /// Reports one counted descriptor's decision (reference §5). The stats key is the limit's
    /// `full_key` unless it depends on the request's values, which costs a lookup and an
    /// allocation only for such limits and for overrides, and only when the observer counts.
    fn report_descriptor(
        &self,
        domain: &Domain,
        request: &Request,
        descriptor: &Descriptor,
        (limit, hits, quota, d): (&Counted<'_>, u64, Quota, &Decision),
        (negative, negative_ignored): (bool, bool),
    ) {
        if !self.observer.counts() {
            return;
        }
        let request_key: String;
        let key = match limit.rule {
            Some(l) if !l.stats_key_varies => StatsKey::Limit {
                slot: &l.stats,
                full_key: &l.full_key,
            },
            Some(l) => match domain.stats_key(&descriptor.entries) {
                Some(k) => {
                    request_key = k;
                    StatsKey::Values {
                        key: &request_key,
                        limit: &l.full_key,
                    }
                }
                None => return,
            },
            None => {
                request_key = override_stats_key(request, descriptor);
                StatsKey::Override {
                    key: &request_key,
                    unit: quota.unit,
                }
            }
        };
        self.observer.descriptor_decided(&DescriptorReport {
            key,
            outcome: Outcome {
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
                    && d.count_before == d.count_after
                    && !d.penalized,
                shadow_mode: limit.shadow_mode(),
                negative,
                negative_ignored,
                slots: if quota.algorithm == Algorithm::Concurrency {
                    SlotChanges::of(d, hits, negative)
                } else {
                    SlotChanges::default()
                },
                penalized: d.penalized,
                penalty_started: quota.penalty.is_some() && d.over && !d.penalized && !negative,
            },
        });
    }

    /// Fail-open versus fail-closed is decided here: by default a backend failure is an error
    /// (gRPC UNKNOWN, as envoyproxy/ratelimit answers), which leaves the choice to Envoy's
    /// `failure_mode_deny`; the operator may instead fail open, globally or per domain, and
    /// then every descriptor answers `{code: OK}`.
    fn backend_failed(&self, request: &Request, e: StoreError) -> Result<Response, ServiceError> {
        let opts = &self.options;
        let fail_open = opts.fail_open || opts.fail_open_domains.contains(&request.domain);
        self.observer.backend_failed(&request.domain, &e, fail_open);
        if fail_open {
            let statuses = all_ok(request);
            let quota: SmallVec<[bool; 8]> = smallvec::smallvec![false; statuses.len()];
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
        statuses: Statuses,
        quota: &[bool],
        dynamic_metadata: Option<serde_json::Value>,
    ) -> Response {
        let mut overall_code = overall_code(&statuses, quota);
        if self.options.shadow_mode && overall_code == Code::OverLimit {
            self.observer.global_shadow_mode();
            overall_code = Code::Ok;
        }
        // As in the Go service, the headers come from the statuses, whatever SHADOW_MODE made of
        // the overall code: an upstream sees `remaining: 0` on a request shadow mode let through.
        let rate_limit = RateLimitHeaders::describing(&statuses, quota);
        let response_headers = if self.options.all_descriptors_headers {
            UnitHeaders::each(&statuses)
        } else {
            NamedHeaders::new(self.header_names.as_ref(), rate_limit).map(ResponseHeaders::Named)
        };
        let request_headers = NamedHeaders::new(self.request_header_names.as_ref(), rate_limit);
        Response {
            overall_code,
            statuses,
            rate_limit,
            response_headers,
            request_headers,
            dynamic_metadata,
        }
    }
}

/// A decision's working buffers: the counter keys' text and the store's decisions. Each thread
/// keeps one set, which a decision takes and gives back when it ends (on whichever thread that
/// is, so a task that moved between awaits leaves them to its new thread), so that after warm-up
/// a decision builds its keys and reads its decisions without allocating.
#[derive(Default)]
struct Buffers {
    keys: String,
    decisions: Vec<Decision>,
}

impl Buffers {
    /// Buffers grown past these (a request of many or long keys) are not kept, so what a thread
    /// holds stays small.
    const MAX_KEY_BYTES: usize = 4096;
    const MAX_DECISIONS: usize = 64;

    fn worth_keeping(&self) -> bool {
        self.keys.capacity() <= Self::MAX_KEY_BYTES
            && self.decisions.capacity() <= Self::MAX_DECISIONS
    }
}

thread_local! {
    static BUFFERS: std::cell::Cell<Buffers> = const {
        std::cell::Cell::new(Buffers { keys: String::new(), decisions: Vec::new() })
    };
}

thread_local! {
    /// A statuses buffer an adapter gave back ([`Response::recycle`]) for the thread's next
    /// answer, so that after warm-up a decision allocates nothing.
    static SPARE_STATUSES: std::cell::Cell<Statuses> = const { std::cell::Cell::new(Vec::new()) };
}

/// Statuses buffers with room for more than this many are not kept.
const MAX_SPARE_STATUSES: usize = 64;

/// An empty statuses buffer with room for `n`: the thread's spare when it has one.
fn statuses_for(n: usize) -> Statuses {
    let mut statuses = SPARE_STATUSES
        .try_with(std::cell::Cell::take)
        .unwrap_or_default();
    statuses.reserve(n);
    statuses
}

impl Response {
    /// Gives the statuses' buffer back to the thread for its next answer; an adapter calls it
    /// once it has written the answer out (or drains the statuses and calls
    /// [`recycle_statuses`]). Dropping a response instead is correct, only slower.
    pub fn recycle(self) {
        recycle_statuses(self.statuses);
    }
}

/// `{code: OK}` for every descriptor of `request`.
fn all_ok(request: &Request) -> Statuses {
    let mut statuses = statuses_for(request.descriptors.len());
    statuses.resize(request.descriptors.len(), Status::ok());
    statuses
}

/// Keeps `statuses`' buffer, emptied, for the thread's next answer.
pub(crate) fn recycle_statuses(mut statuses: Statuses) {
    if statuses.capacity() == 0 || statuses.capacity() > MAX_SPARE_STATUSES {
        return;
    }
    statuses.clear();
    let _ = SPARE_STATUSES.try_with(|s| s.set(statuses));
}

/// The thread's [`Buffers`], taken for one decision and given back on drop.
struct Scratch(Buffers);

impl Scratch {
    fn take() -> Self {
        // A thread whose locals are being destroyed gets fresh buffers.
        Scratch(BUFFERS.try_with(std::cell::Cell::take).unwrap_or_default())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.0.worth_keeping() {
            let buffers = std::mem::take(&mut self.0);
            let _ = BUFFERS.try_with(|b| b.set(buffers));
        }
    }
}

/// An override's stats key: `domain.k1_v1.k2_v2`.
fn override_stats_key(request: &Request, descriptor: &Descriptor) -> String {
    let mut key = String::with_capacity(64);
    key.push_str(&request.domain);
    for e in &descriptor.entries {
        key.push('.');
        key.push_str(&e.key);
        key.push('_');
        key.push_str(&e.value);
    }
    key
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
/// least remaining. A negative descriptor (a refund; its decisions are peeks at what it left)
/// is OK whatever they say, with the limit, what remains and the reset of that quota, as the
/// Go service answers one.
fn counted_status<'d>(
    limit: &Counted<'_>,
    negative: bool,
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
    let code = if d.over && !limit.shadow_mode() && !negative {
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
/// `/json` send them under LIMIT_*_HEADER's names ([`NamedHeaders`]) when
/// LIMIT_RESPONSE_HEADERS_ENABLED is set, and under LIMIT_REQUEST_*_HEADER's names for the
/// upstream when LIMIT_REQUEST_HEADERS_ENABLED is set; `/nginx` and `/forward-auth` always
/// under their fixed names, HAProxy's agent as variables.
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
    pub(crate) fn describing(statuses: &[Status], quota: &[bool]) -> Option<Self> {
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
}

/// The `RateLimit-*` headers to add: the names (the service's own, shared, so an answer copies
/// none of them) with the values they carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedHeaders {
    pub names: Arc<HeaderNames>,
    pub values: RateLimitHeaders,
}

impl NamedHeaders {
    /// `values` under `names`, when both are there (the headers are enabled, a limit matched).
    fn new(names: Option<&Arc<HeaderNames>>, values: Option<RateLimitHeaders>) -> Option<Self> {
        Some(NamedHeaders {
            names: names?.clone(),
            values: values?,
        })
    }

    /// The headers under the limit, remaining and reset names (LIMIT_LIMIT_HEADER,
    /// LIMIT_REMAINING_HEADER and LIMIT_RESET_HEADER, or their LIMIT_REQUEST_* twins), in that
    /// order.
    pub fn pairs(&self) -> [(&str, u64); 3] {
        let (names, values) = (&*self.names, &self.values);
        [
            (&names.limit, u64::from(values.limit)),
            (&names.remaining, u64::from(values.remaining)),
            (&names.reset, values.reset_secs),
        ]
    }
}

/// What `response_headers_to_add` carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResponseHeaders {
    /// LIMIT_RESPONSE_HEADERS_ENABLED: the `RateLimit-*` headers of the one status
    /// [`RateLimitHeaders::describing`] chose.
    Named(NamedHeaders),
    /// LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED, as envoyproxy/ratelimit's open PR #1190 has it:
    /// two headers per status that has a current limit, in request order, whatever
    /// LIMIT_RESPONSE_HEADERS_ENABLED says. Never empty.
    EachDescriptor(Vec<UnitHeaders>),
}

impl ResponseHeaders {
    /// The headers, names and values, in the order they are sent.
    pub fn pairs(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        let (one, each) = match self {
            ResponseHeaders::Named(h) => (Some(h.pairs()), &[][..]),
            ResponseHeaders::EachDescriptor(each) => (None, each.as_slice()),
        };
        one.into_iter()
            .flatten()
            .chain(each.iter().flat_map(UnitHeaders::pairs))
    }
}

/// One status's LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED headers: `ratelimit-limit-<unit>s` and
/// `ratelimit-remaining-<unit>s` (`-seconds`, `-minutes`, ..., `-years`), fixed names with no
/// reset header, as PR #1190 writes them. Two statuses of one unit send the same names twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnitHeaders {
    pub unit: Unit,
    pub limit: u32,
    pub remaining: u32,
}

impl UnitHeaders {
    /// The headers of every status with a current limit (unmatched, replaced and unlimited
    /// descriptors have none); `None` when no status has one.
    fn each(statuses: &[Status]) -> Option<ResponseHeaders> {
        let each: Vec<UnitHeaders> = statuses
            .iter()
            .filter_map(|s| {
                let limit = s.current_limit.as_ref()?;
                Some(UnitHeaders {
                    unit: limit.unit,
                    limit: limit.requests_per_unit,
                    remaining: s.limit_remaining,
                })
            })
            .collect();
        (!each.is_empty()).then_some(ResponseHeaders::EachDescriptor(each))
    }

    /// `[(ratelimit-limit-<unit>s, limit), (ratelimit-remaining-<unit>s, remaining)]`.
    pub fn pairs(&self) -> [(&str, u64); 2] {
        let (limit, remaining) = match self.unit {
            Unit::Second => ("ratelimit-limit-seconds", "ratelimit-remaining-seconds"),
            Unit::Minute => ("ratelimit-limit-minutes", "ratelimit-remaining-minutes"),
            Unit::Hour => ("ratelimit-limit-hours", "ratelimit-remaining-hours"),
            Unit::Day => ("ratelimit-limit-days", "ratelimit-remaining-days"),
            Unit::Week => ("ratelimit-limit-weeks", "ratelimit-remaining-weeks"),
            Unit::Month => ("ratelimit-limit-months", "ratelimit-remaining-months"),
            Unit::Year => ("ratelimit-limit-years", "ratelimit-remaining-years"),
        };
        [
            (limit, u64::from(self.limit)),
            (remaining, u64::from(self.remaining)),
        ]
    }
}

#[cfg(test)]
mod tests;
