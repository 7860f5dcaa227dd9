//! What a decision reports, and to whom: the narrow interface between the decision and
//! telemetry.
//!
//! The decision calls an [`Observer`] with facts in its own terms (a call's request and
//! answer, each counted descriptor's outcome, a backend call, a failure) and knows no wire
//! format: telemetry's `DecisionTelemetry` turns these into envoyproxy/ratelimit's
//! stats, OTLP spans and logs. Telemetry implements this trait, so it depends on the service
//! and not the reverse; the default observer ([`Unobserved`]) records nothing.

use std::any::Any;
use std::time::Duration;

use super::{Response, ServiceError};
use crate::config::StatsSlot;
use crate::descriptor::Request;
use crate::limiter::Unit;
use crate::store::{StoreError, TraceBackend};

/// The context an adapter decoded from a call for its observer (the caller's trace context),
/// opaque to the decision.
pub(crate) type Caller<'a> = &'a (dyn Any + Send + Sync);

/// A traced call's span (or its backend call's) in progress, opaque to the decision: the
/// observer makes it and takes it back.
pub struct Span(pub Box<dyn Any + Send + Sync>);

/// Where a counted descriptor's stats go.
#[derive(Clone, Copy, Debug)]
pub enum StatsKey<'a> {
    /// A configured limit whose key never depends on the request: its `full_key`, with the
    /// limit's slot caching the link to its counters.
    Limit {
        slot: &'a StatsSlot,
        full_key: &'a str,
    },
    /// A key built from the request's values (`detailed_metric`, `value_to_metric`) for the
    /// configured limit whose `full_key` is `limit`.
    Values { key: &'a str, limit: &'a str },
    /// A per-request override's key (`domain.k1_v1.k2_v2`); the override's requests_per_unit is
    /// the outcome's limit, and this its unit.
    Override { key: &'a str, unit: Unit },
}

/// One counted descriptor's decision, against the quota its status reports.
#[derive(Clone, Copy, Debug)]
pub struct DescriptorReport<'a> {
    pub key: StatsKey<'a>,
    pub outcome: Outcome,
}

/// One descriptor's decision in the terms envoyproxy/ratelimit's stats count it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The hits this call charged (N).
    pub hits: u64,
    /// requests_per_unit (L).
    pub limit: u32,
    pub count_before: u64,
    pub count_after: u64,
    pub over: bool,
    /// The Redis store's local over-limit cache answered without charging the counter.
    pub from_local_cache: bool,
    /// The limit's own `shadow_mode`.
    pub shadow_mode: bool,
    /// The hits were a refund (`is_negative_hits`), not a charge: counted as
    /// `total_negative_hits` and nothing else, as the Go service counts them.
    pub negative: bool,
    /// A refund not applied (SLUICE_NEGATIVE_HITS): a limit of the descriptor does not count
    /// refused hits, so it would have given back capacity a refused request never took.
    pub negative_ignored: bool,
    /// What the call did to a concurrency limit's slots (all 0 for the other algorithms).
    pub slots: SlotChanges,
    /// Refused by a penalty in force (`penalty_seconds`), the counter untouched.
    pub penalized: bool,
    /// Refused by the counter of a limit with a penalty: a penalty starts.
    pub penalty_started: bool,
}

/// A concurrency limit's slots moved by one call ([`crate::limiter::concurrency`]): taken by
/// an admitted start, given back by a refund (a refund that paid a refused start's debt gives
/// back none), expired before the call with no refund (each a lost refund).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotChanges {
    pub taken: u64,
    pub given_back: u64,
    pub expired: u64,
}

impl SlotChanges {
    /// The slots a decision on a concurrency limit moved: a start's `hits` when admitted, a
    /// refund's held slots before less after.
    pub fn of(decision: &crate::limiter::Decision, hits: u64, negative: bool) -> Self {
        let d = decision;
        SlotChanges {
            taken: if negative || d.over { 0 } else { hits },
            given_back: if negative {
                d.count_before.saturating_sub(d.count_after)
            } else {
                0
            },
            expired: u64::from(d.expired),
        }
    }
}

impl Outcome {
    /// `hits` admitted under a limit of `limit` on a fresh counter, no cache, shadow or
    /// refund involved: the plain case tests and examples record.
    pub fn admitted(hits: u64, limit: u32) -> Outcome {
        Outcome {
            hits,
            limit,
            count_before: 0,
            count_after: hits,
            over: false,
            from_local_cache: false,
            shadow_mode: false,
            negative: false,
            negative_ignored: false,
            slots: Default::default(),
            penalized: false,
            penalty_started: false,
        }
    }
}

/// A finished call.
pub struct CallReport<'a> {
    pub caller: Caller<'a>,
    pub request: &'a Request,
    pub result: &'a Result<Response, ServiceError>,
    /// How long the decision took, by the service's clock.
    pub elapsed: Duration,
}

/// The decision's reports. Every method has a default that records nothing.
pub trait Observer: Send + Sync + 'static {
    /// Whether adapters should decode callers' trace contexts for [`Observer::call_started`].
    fn traces(&self) -> bool {
        false
    }

    /// Whether calls and descriptors are counted; when not, and the call has no span, the
    /// decision skips its timing and its per-descriptor reports.
    fn counts(&self) -> bool {
        false
    }

    /// A call begins; a span when the call is traced (sampled).
    fn call_started(&self, _caller: Caller<'_>) -> Option<Span> {
        None
    }

    /// A call ends (only reported when it [`counts`](Observer::counts) or has a span).
    fn call_done(&self, _call: &CallReport<'_>, _span: Option<Span>) {}

    /// A traced call is about to call a backend worth a span of its own.
    fn backend_started(&self, _call: &Span) -> Option<Span> {
        None
    }

    /// That backend call ended, having charged `counters` counters.
    fn backend_done(
        &self,
        _span: Span,
        _backend: TraceBackend,
        _counters: usize,
        _error: Option<&StoreError>,
    ) {
    }

    /// The request named a domain no config has.
    fn domain_not_found(&self, _domain: &str) {}

    /// One counted descriptor was decided (only reported when the observer counts).
    fn descriptor_decided(&self, _report: &DescriptorReport<'_>) {}

    /// The backend failed; `fail_open` says the request is answered OK anyway.
    fn backend_failed(&self, _domain: &str, _error: &StoreError, _fail_open: bool) {}

    /// A refused request's admitted hits could not be given back (the answer stands).
    fn refund_failed(&self, _error: &StoreError) {}

    /// Negative hits on the limit `limit` (its config key, or an override's stats key) were
    /// not applied, because a limit of the descriptor does not count refused hits
    /// (SLUICE_NEGATIVE_HITS). Reported whether or not the observer counts.
    fn negative_hits_ignored(&self, _limit: &str) {}

    /// Global SHADOW_MODE turned an OVER_LIMIT answer into OK.
    fn global_shadow_mode(&self) {}

    /// A request's reservations ([`super::reserve`]), one per reserving or settling descriptor:
    /// how many it opened and settled, and how many settles came after a window holding their
    /// estimate had ended.
    fn reservations(&self, _opened: u64, _settled: u64, _late: u64) {}
}

/// The observer of a service nobody watches: records nothing.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Unobserved;

impl Observer for Unobserved {}
