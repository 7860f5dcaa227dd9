//! The decision's first steps, before the store is called: what each descriptor resolves to
//! (its [`Plan`]), `replaces`, the request's counter keys and the hits to charge; and, after the
//! store answered, the hits a refused request gives back.

use std::ops::Range;

use smallvec::SmallVec;

use super::{Code, ServiceError, ServiceOptions, Status};
use crate::config::{Block, Domain, Limit, Rule};
use crate::descriptor::Request;
use crate::key;
use crate::limiter::{Decision, Quota};
use crate::store::Hit;

/// A limit that is counted: from config (`rule` is the matched limit, whose blocks give the
/// quotas) or from the request's override (`rule` is `None`: one fixed-window quota, no name,
/// no shadow mode, no replaces).
#[derive(Clone, Copy)]
pub(super) struct Counted<'c> {
    pub(super) rule: Option<&'c Limit>,
    overridden: Option<Quota>,
}

impl<'c> Counted<'c> {
    /// The quotas to enforce, each with its block name ("" for none).
    pub(super) fn quotas(&self) -> impl Iterator<Item = (Quota, &'c str)> + '_ {
        let blocks: &'c [Block] = match self.rule.map(|l| &l.rule) {
            Some(Rule::Limited(blocks)) => blocks,
            _ => &[],
        };
        self.overridden
            .map(|q| (q, ""))
            .into_iter()
            .chain(blocks.iter().map(|b| (b.quota, b.name.as_str())))
    }
    /// How many quotas [`Counted::quotas`] gives, without walking them.
    pub(super) fn quota_count(&self) -> usize {
        let blocks = match self.rule.map(|l| &l.rule) {
            Some(Rule::Limited(blocks)) => blocks.len(),
            _ => 0,
        };
        usize::from(self.overridden.is_some()) + blocks
    }
    pub(super) fn shadow_mode(&self) -> bool {
        self.rule.is_some_and(|l| l.shadow_mode)
    }
    pub(super) fn quota_mode(&self, global: bool) -> bool {
        global || self.rule.is_some_and(|l| l.quota_mode)
    }
    /// The name reported for a block: its own, else the limit's (`rate_limit.name`).
    pub(super) fn name_for(&self, block_name: &'c str) -> &'c str {
        match (block_name, self.rule) {
            ("", Some(l)) => &l.name,
            (name, _) => name,
        }
    }
}

/// What one descriptor resolved to.
pub(super) enum Plan<'c> {
    /// No match, or replaced: `{code: OK}`.
    Pass,
    Unlimited(&'c Limit),
    Counted {
        limit: Counted<'c>,
        /// `share_threshold` substitutions for the counter key.
        shared: Vec<(usize, &'c str)>,
        hits: u64,
        /// `is_negative_hits`: the hits come off the counters (a refund).
        negative: bool,
    },
}

/// One plan per request descriptor, in request order.
pub(super) type Plans<'c> = SmallVec<[Plan<'c>; 4]>;

impl<'c> Plan<'c> {
    /// Whether the descriptor refunds its hits (`is_negative_hits`) rather than charging them.
    pub(super) fn is_negative(&self) -> bool {
        matches!(self, Plan::Counted { negative: true, .. })
    }

    /// The matched config limit, if any (overrides have none).
    pub(super) fn config_limit(&self) -> Option<&'c Limit> {
        match self {
            Plan::Pass => None,
            Plan::Unlimited(l) => Some(l),
            Plan::Counted { limit, .. } => limit.rule,
        }
    }
}

/// Resolves every descriptor: the override when present (it skips config matching), else the
/// config match.
pub(super) fn plan<'c>(domain: &'c Domain, request: &Request) -> Plans<'c> {
    let request_hits = u64::from(request.hits_addend.max(1));
    request
        .descriptors
        .iter()
        .map(|d| {
            let hits = d.hits_addend.unwrap_or(request_hits);
            let negative = d.negative_hits;
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
                    negative,
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
                    negative,
                },
            }
        })
        .collect()
}

/// `replaces`: the names listed by any matched limit (unlimited ones included) knock out the
/// matched limits of that name, which then answer `{code: OK}` uncounted.
pub(super) fn apply_replaces(plans: &mut [Plan<'_>]) {
    let replaced: Vec<&str> = plans
        .iter()
        .filter_map(Plan::config_limit)
        .flat_map(|l| l.replaces.iter().map(String::as_str))
        .collect();
    if replaced.is_empty() {
        return;
    }
    for plan in plans {
        if plan
            .config_limit()
            .is_some_and(|l| l.names().any(|n| replaced.contains(&n)))
        {
            *plan = Plan::Pass;
        }
    }
}

/// Every counter key of a request in one buffer (the caller's, reused across calls), one range
/// per quota counted, in order.
pub(super) struct CounterKeys<'b> {
    text: &'b str,
    ranges: SmallVec<[Range<usize>; 4]>,
}

/// The total length of the request's counter keys, once each is known to fit
/// SLUICE_MAX_KEY_BYTES. Only descriptors that are counted make keys: one that matches no
/// limit, an unlimited one or a replaced one answers OK whatever its size, as in the Go
/// service, and costs nothing beyond the request (capped by SLUICE_MAX_REQUEST_BYTES).
fn counter_key_bytes(
    options: &ServiceOptions,
    request: &Request,
    plans: &[Plan<'_>],
) -> Result<usize, ServiceError> {
    let max = options.max_key_bytes;
    let mut total = 0;
    for (index, (d, plan)) in request.descriptors.iter().zip(plans).enumerate() {
        let Plan::Counted { limit, shared, .. } = plan else {
            continue;
        };
        let prefix = &options.cache_key_prefix;
        let stem = key::counter_key_len(prefix, &request.domain, &d.entries, shared);
        let len = key::limit_keys_len(stem, limit.quota_count());
        if len.longest > max {
            let bytes = len.longest;
            return Err(ServiceError::KeyTooLong { index, bytes, max });
        }
        total += len.total;
    }
    Ok(total)
}

/// The request's counter keys ([`key::write_limit_keys`]): the first quota of a descriptor uses
/// the Go service's key; further quotas of a `rate_limits` list add `#<index>_`. Measured, and
/// refused past SLUICE_MAX_KEY_BYTES, before anything is written. `keys` is cleared first: a
/// buffer reused from call to call, so keys cost no allocation once it has grown to a
/// request's size.
pub(super) fn counter_keys<'b>(
    options: &ServiceOptions,
    request: &Request,
    plans: &[Plan<'_>],
    keys: &'b mut String,
) -> Result<CounterKeys<'b>, ServiceError> {
    let bytes = counter_key_bytes(options, request, plans)?;
    keys.clear();
    keys.reserve(bytes);
    let mut ranges = SmallVec::new();
    for (d, plan) in request.descriptors.iter().zip(plans) {
        if let Plan::Counted { limit, shared, .. } = plan {
            let start = keys.len();
            let prefix = &options.cache_key_prefix;
            key::write_counter_key(keys, prefix, &request.domain, &d.entries, shared);
            let stem = start..keys.len();
            key::write_limit_keys(keys, stem, limit.quota_count(), |r| ranges.push(r));
        }
    }
    Ok(CounterKeys {
        text: keys.as_str(),
        ranges,
    })
}

/// The hits to charge (or, for a negative descriptor, to refund): one per quota of every
/// counted descriptor, in order. Every counted descriptor is charged, even when another is
/// already over (the Go service does the same, so over-limit traffic keeps draining every
/// counter).
pub(super) fn hits<'k>(plans: &[Plan<'_>], keys: &CounterKeys<'k>) -> SmallVec<[Hit<'k>; 4]> {
    let mut out = SmallVec::new();
    let mut ranges = keys.ranges.iter();
    for plan in plans {
        let Plan::Counted { limit, hits, .. } = plan else {
            continue;
        };
        for ((quota, _), range) in limit.quotas().zip(ranges.by_ref()) {
            out.push(Hit {
                key: keys.text.get(range.clone()).unwrap_or_default(),
                quota,
                hits: *hits,
            });
        }
    }
    out
}

/// Whether a hit of each quota counted, in [`hits`]' order, is a refund (`is_negative_hits`).
pub(super) fn negative_mask(plans: &[Plan<'_>]) -> SmallVec<[bool; 4]> {
    let mut mask = SmallVec::new();
    for plan in plans {
        if let Plan::Counted {
            limit, negative, ..
        } = plan
        {
            mask.extend(std::iter::repeat_n(*negative, limit.quota_count()));
        }
    }
    mask
}

/// What a refused request gives back: this policy, not the store, decides what a refund
/// takes. A descriptor with several limits is refused as a whole when one of them refuses:
/// the limits that admitted it give the hits back, except fixed windows, which keep a refused
/// request's hits as the Go service counts them, and limits that charge refused hits; so a
/// refused request consumes nothing it need not. A negative descriptor's hits were refunds,
/// not charges: it gives nothing back.
pub(super) fn refunds<'k>(
    plans: &[Plan<'_>],
    hits: &[Hit<'k>],
    decisions: &[Decision],
) -> Vec<Hit<'k>> {
    let mut refunds = Vec::new();
    let mut at = 0;
    for plan in plans {
        if let Plan::Counted {
            limit, negative, ..
        } = plan
        {
            let n = limit.quota_count();
            let own = &decisions[at..at + n];
            if n > 1 && !negative && own.iter().any(|d| d.over) {
                refunds.extend(
                    hits[at..at + n]
                        .iter()
                        .zip(own)
                        .filter(|(h, d)| !d.over && !h.quota.charges_refused())
                        .map(|(h, _)| *h),
                );
            }
            at += n;
        }
    }
    refunds
}

/// OVER_LIMIT iff some non-quota descriptor is over, or there is at least one quota
/// descriptor and all of them are over.
pub(super) fn overall_code(statuses: &[Status], quota: &[bool]) -> Code {
    let over = |i: usize| statuses[i].code == Code::OverLimit;
    let non_quota_over = (0..statuses.len()).any(|i| !quota[i] && over(i));
    let quota_count = quota.iter().filter(|q| **q).count();
    let all_quota_over = quota_count > 0 && (0..statuses.len()).all(|i| !quota[i] || over(i));
    if non_quota_over || all_quota_over {
        Code::OverLimit
    } else {
        Code::Ok
    }
}
