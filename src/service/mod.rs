//! The decision: turns a decoded [`Request`] into a [`Response`].
//!
//! This is where envoyproxy/ratelimit's semantics live: config matching (or the per-request
//! override), `replaces`, unlimited limits, hits addends, counter keys, shadow and quota modes,
//! the overall code and the `RateLimit-*` headers. It is protocol-free: `api` decodes into
//! [`Request`] and encodes [`Response`]; the store does the counting.

use std::sync::Arc;

use crate::clock::Clock;
use crate::config::{ConfigHandle, Limit, Rule};
use crate::descriptor::{Entry, Request};
use crate::limiter::Unit;
use crate::limiter::fixed_window::Decision;
use crate::store::{CounterStore, Hit, StoreError};

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
    /// `RateLimit-*` headers, when enabled.
    pub response_headers: Vec<(String, String)>,
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
            ServiceError::TooManyDescriptors { .. } | ServiceError::TooManyEntries { .. }
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
    pub max_descriptors: usize,
    pub max_entries: usize,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        ServiceOptions {
            shadow_mode: false,
            quota_mode: false,
            response_headers: None,
            cache_key_prefix: String::new(),
            max_descriptors: 64,
            max_entries: 32,
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
        let value = shared_values
            .iter()
            .find(|(at, _)| *at == i)
            .map_or(entry.value.as_str(), |(_, pattern)| pattern);
        buf.push_str(&entry.key);
        buf.push('_');
        buf.push_str(value);
        buf.push('_');
    }
}

/// What one descriptor resolved to before counting.
enum Plan<'c> {
    /// No match, unknown domain, or replaced: `{code: OK}`.
    Pass,
    Unlimited,
    Counted {
        limit: CountedLimit<'c>,
        key: std::ops::Range<usize>,
        hits: u64,
    },
}

/// A limit that is counted: from config, or the request's override.
#[derive(Clone, Copy)]
enum CountedLimit<'c> {
    Config {
        limit: &'c Limit,
        requests_per_unit: u32,
        unit: Unit,
    },
    Override {
        requests_per_unit: u32,
        unit: Unit,
    },
}

impl CountedLimit<'_> {
    fn requests_per_unit(&self) -> u32 {
        match *self {
            CountedLimit::Config {
                requests_per_unit, ..
            }
            | CountedLimit::Override {
                requests_per_unit, ..
            } => requests_per_unit,
        }
    }
    fn unit(&self) -> Unit {
        match *self {
            CountedLimit::Config { unit, .. } | CountedLimit::Override { unit, .. } => unit,
        }
    }
    fn shadow_mode(&self) -> bool {
        matches!(self, CountedLimit::Config { limit, .. } if limit.shadow_mode)
    }
    fn quota_mode(&self, global: bool) -> bool {
        global || matches!(self, CountedLimit::Config { limit, .. } if limit.quota_mode)
    }
    fn name(&self) -> &str {
        match self {
            CountedLimit::Config { limit, .. } => &limit.name,
            CountedLimit::Override { .. } => "",
        }
    }
}

/// The rate-limit service core, generic over the counter store.
pub struct RateLimitService<S> {
    config: ConfigHandle,
    store: Arc<S>,
    clock: Arc<dyn Clock>,
    options: ServiceOptions,
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
        }
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

    /// `ShouldRateLimit`.
    pub async fn should_rate_limit(&self, request: Request) -> Result<Response, ServiceError> {
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
        if let Some((index, d)) = request
            .descriptors
            .iter()
            .enumerate()
            .find(|(_, d)| d.entries.len() > opts.max_entries)
        {
            return Err(ServiceError::TooManyEntries {
                index,
                count: d.entries.len(),
                max: opts.max_entries,
            });
        }
        let config = self.config.current().ok_or(ServiceError::NoConfig)?;
        let Some(domain) = config.domain(&request.domain) else {
            // An unknown domain is not an error in the Go service: every descriptor passes.
            return Ok(self.finish(vec![Status::ok(); request.descriptors.len()]));
        };

        // Resolve every descriptor to a limit: the override when present (it skips config
        // matching and has no name, shadow mode or replaces), else the config match.
        let request_hits = u64::from(request.hits_addend.max(1));
        let mut matched: Vec<Option<(CountedLimitOrUnlimited<'_>, Vec<(usize, &str)>)>> =
            Vec::with_capacity(request.descriptors.len());
        for d in &request.descriptors {
            let resolved = match d.limit_override {
                Some(o) => Some((
                    CountedLimitOrUnlimited::Counted(CountedLimit::Override {
                        requests_per_unit: o.requests_per_unit,
                        unit: o.unit,
                    }),
                    Vec::new(),
                )),
                None => domain.lookup(&d.entries).map(|m| {
                    let limit = match m.limit.rule {
                        Rule::Unlimited => CountedLimitOrUnlimited::Unlimited(m.limit),
                        Rule::Limited {
                            requests_per_unit,
                            unit,
                        } => CountedLimitOrUnlimited::Counted(CountedLimit::Config {
                            limit: m.limit,
                            requests_per_unit,
                            unit,
                        }),
                    };
                    (limit, m.shared_values)
                }),
            };
            matched.push(resolved);
        }

        // `replaces`: the names listed by any matched limit (unlimited ones included) knock
        // out matched limits of that name.
        let replaced: Vec<&str> = matched
            .iter()
            .flatten()
            .filter_map(|(l, _)| l.config_limit())
            .flat_map(|l| l.replaces.iter().map(String::as_str))
            .collect();

        let mut keys = String::new();
        let mut plans = Vec::with_capacity(request.descriptors.len());
        for (d, m) in request.descriptors.iter().zip(&matched) {
            let plan = match m {
                None => Plan::Pass,
                Some((l, _))
                    if l.config_limit()
                        .is_some_and(|c| !c.name.is_empty() && replaced.contains(&&*c.name)) =>
                {
                    Plan::Pass
                }
                Some((CountedLimitOrUnlimited::Unlimited(_), _)) => Plan::Unlimited,
                Some((CountedLimitOrUnlimited::Counted(limit), shared)) => {
                    let start = keys.len();
                    write_counter_key(
                        &mut keys,
                        &opts.cache_key_prefix,
                        &request.domain,
                        &d.entries,
                        shared,
                    );
                    Plan::Counted {
                        limit: *limit,
                        key: start..keys.len(),
                        hits: d.hits_addend.unwrap_or(request_hits),
                    }
                }
            };
            plans.push(plan);
        }

        // Every counted descriptor is charged, even when another is already over (the Go
        // service does the same, so over-limit traffic keeps draining every counter).
        let hits: Vec<Hit<'_>> = plans
            .iter()
            .filter_map(|p| match p {
                Plan::Counted { limit, key, hits } => Some(Hit {
                    key: &keys[key.clone()],
                    unit: limit.unit(),
                    limit: limit.requests_per_unit(),
                    hits: *hits,
                }),
                _ => None,
            })
            .collect();
        let mut decisions = Vec::with_capacity(hits.len());
        if !hits.is_empty() {
            let now = self.clock.now();
            self.store.apply(now, &hits, &mut decisions).await?;
        }

        let mut decisions = decisions.into_iter();
        let statuses = plans
            .iter()
            .map(|p| match p {
                Plan::Pass => Status::ok(),
                Plan::Unlimited => Status::unlimited(),
                Plan::Counted { limit, .. } => {
                    // The store returns one decision per hit, in order.
                    let d = decisions.next().unwrap_or(Decision {
                        count_after: 0,
                        count_before: 0,
                        over: false,
                        remaining: limit.requests_per_unit(),
                        reset_after_secs: limit.unit().secs(),
                    });
                    counted_status(limit, &d)
                }
            })
            .collect::<Vec<_>>();
        let quota: Vec<bool> = plans
            .iter()
            .map(|p| matches!(p, Plan::Counted { limit, .. } if limit.quota_mode(opts.quota_mode)))
            .collect();
        Ok(self.finish_with_quota(statuses, &quota))
    }

    fn finish(&self, statuses: Vec<Status>) -> Response {
        let quota = vec![false; statuses.len()];
        self.finish_with_quota(statuses, &quota)
    }

    /// Overall code, global shadow mode and headers.
    fn finish_with_quota(&self, statuses: Vec<Status>, quota: &[bool]) -> Response {
        let over = |i: usize| statuses[i].code == Code::OverLimit;
        let non_quota_over = (0..statuses.len()).any(|i| !quota[i] && over(i));
        let quota_count = quota.iter().filter(|q| **q).count();
        let all_quota_over = quota_count > 0 && (0..statuses.len()).all(|i| !quota[i] || over(i));
        let mut overall_code = if non_quota_over || all_quota_over {
            Code::OverLimit
        } else {
            Code::Ok
        };
        if self.options.shadow_mode {
            overall_code = Code::Ok;
        }
        let response_headers = match &self.options.response_headers {
            Some(names) => rate_limit_headers(names, &statuses, quota),
            None => Vec::new(),
        };
        Response {
            overall_code,
            statuses,
            response_headers,
        }
    }
}

/// A matched config limit that is unlimited, or a limit that is counted.
#[derive(Clone, Copy)]
enum CountedLimitOrUnlimited<'c> {
    Unlimited(&'c Limit),
    Counted(CountedLimit<'c>),
}

impl<'c> CountedLimitOrUnlimited<'c> {
    fn config_limit(&self) -> Option<&'c Limit> {
        match *self {
            CountedLimitOrUnlimited::Unlimited(l) => Some(l),
            CountedLimitOrUnlimited::Counted(CountedLimit::Config { limit, .. }) => Some(limit),
            CountedLimitOrUnlimited::Counted(CountedLimit::Override { .. }) => None,
        }
    }
}

fn counted_status(limit: &CountedLimit<'_>, d: &Decision) -> Status {
    // Per-rule shadow mode answers OK with remaining 0, while the counter keeps counting.
    let code = if d.over && !limit.shadow_mode() {
        Code::OverLimit
    } else {
        Code::Ok
    };
    Status {
        code,
        current_limit: Some(CurrentLimit {
            requests_per_unit: limit.requests_per_unit(),
            unit: limit.unit(),
            name: limit.name().to_owned(),
        }),
        limit_remaining: d.remaining,
        duration_until_reset_secs: Some(d.reset_after_secs),
    }
}

/// The Go service's header choice: the status with the least remaining among those with a
/// current limit, unless a non-quota descriptor is over, in which case the last such one.
fn rate_limit_headers(
    names: &HeaderNames,
    statuses: &[Status],
    quota: &[bool],
) -> Vec<(String, String)> {
    let mut chosen: Option<&Status> = None;
    for s in statuses.iter().filter(|s| s.current_limit.is_some()) {
        if chosen.is_none_or(|c| s.limit_remaining < c.limit_remaining) {
            chosen = Some(s);
        }
    }
    if let Some(last_over) = statuses
        .iter()
        .zip(quota)
        .rev()
        .find(|(s, q)| !**q && s.code == Code::OverLimit)
    {
        chosen = Some(last_over.0);
    }
    let Some(s) = chosen else { return Vec::new() };
    let Some(limit) = &s.current_limit else {
        return Vec::new();
    };
    vec![
        (names.limit.clone(), limit.requests_per_unit.to_string()),
        (names.remaining.clone(), s.limit_remaining.to_string()),
        (
            names.reset.clone(),
            s.duration_until_reset_secs.unwrap_or(0).to_string(),
        ),
    ]
}

#[cfg(test)]
mod tests;
