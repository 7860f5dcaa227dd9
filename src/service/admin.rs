//! The counter admin behind the debug port's `/debug/counters`: a request's counters as they
//! stand (every quota each descriptor would be charged against, with the store's answer to a
//! peek of 0 hits, so nothing is counted) and their reset. It resolves descriptors exactly as
//! `ShouldRateLimit` does (overrides, `share_threshold`, key prefix, `#<index>_` for later
//! `rate_limits` blocks); `replaces` is not applied, so a replaced limit can still be read and
//! reset. On a peer cluster the store takes each counter to its owner, as for a charge.

use std::num::NonZeroU32;

use serde_json::{Value, json};

use crate::clock::Timestamp;
use crate::config::{Domain, Limit, RateLimitConfig, Rule, Step};
use crate::descriptor::{Descriptor, Request};
use crate::limiter::{Decision, Quota};
use crate::store::{CounterStore, Hit};

use super::plan::{self, Plan};
use super::{RateLimitService, ServiceError};

/// One counter of a request, as the admin shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CounterView {
    /// The request descriptor it belongs to.
    pub descriptor: usize,
    /// The counter key stem, as the stores name it (`domain_key_value_...`).
    pub key: String,
    /// The matched limit's config path (`domain.key_value`), "" for a request override.
    pub limit: String,
    /// The block's name, else the limit's ("" for none).
    pub name: String,
    /// Where the limit was set: `config`, `runtime`, or `override` for a request override.
    pub source: &'static str,
    pub quota: Quota,
    /// The store's answer to a peek of 0 hits: `count_before` is what the counter holds (a
    /// bucket's in hits not yet drained), `over` what a check of 0 hits answers.
    pub state: Decision,
    /// Of `count_before`, the hits open reservations hold (their estimates, not yet settled):
    /// the counter's reserved twin ([`super::reserve`]); `None` for a bucket.
    pub reserved: Option<u64>,
}

impl<S: CounterStore> RateLimitService<S> {
    /// Every counter `request` would be charged against, read without counting. A domain
    /// that is not loaded, or descriptors that match no counted limit, give none.
    pub(crate) async fn inspect_counters(
        &self,
        request: &Request,
    ) -> Result<Vec<CounterView>, ServiceError> {
        self.counters(request, false).await
    }

    /// Forgets every counter `request` would be charged against (on its owner, in a
    /// cluster), then reads them as [`RateLimitService::inspect_counters`] does.
    pub(crate) async fn reset_counters(
        &self,
        request: &Request,
    ) -> Result<Vec<CounterView>, ServiceError> {
        self.counters(request, true).await
    }

    async fn counters(
        &self,
        request: &Request,
        reset: bool,
    ) -> Result<Vec<CounterView>, ServiceError> {
        self.check_caps(request)?;
        let guard = self.config.guard();
        let config = guard.as_ref().ok_or(ServiceError::NoConfig)?;
        let Some(domain) = config.domain(&request.domain) else {
            return Ok(Vec::new());
        };
        let plans = plan::plan(domain, request);
        let mut keys = String::new();
        let keys = plan::counter_keys(&self.options, request, &plans, &mut keys)?;
        let peeks: Vec<Hit<'_>> = plan::hits(&plans, &keys)
            .into_iter()
            .map(|h| Hit { hits: 0, ..h })
            .collect();
        if reset {
            let now = Timestamp::from_nanos(self.clock.now_nanos());
            self.store.reset(now, &peeks).await?;
        }
        let states = self.peek(&peeks).await?;
        let reserved = self.reserved(&peeks, reset).await?;
        let mut views = Vec::with_capacity(peeks.len());
        let mut at = peeks.iter().zip(states).zip(reserved);
        for (descriptor, plan) in plans.iter().enumerate() {
            let Plan::Counted { limit, .. } = plan else {
                continue;
            };
            for ((_, block_name), ((hit, state), reserved)) in limit.quotas().zip(at.by_ref()) {
                views.push(CounterView {
                    descriptor,
                    key: hit.key.to_owned(),
                    limit: limit.rule.map_or(String::new(), |l| l.full_key.clone()),
                    name: limit.name_for(block_name).to_owned(),
                    source: limit.rule.map_or("override", |l| l.source.name()),
                    quota: hit.quota,
                    state,
                    reserved,
                });
            }
        }
        Ok(views)
    }
}

impl<S: CounterStore> RateLimitService<S> {
    /// What each peeked counter's reserved twin holds (reset first with `reset`); `None` for a
    /// counter without a twin.
    async fn reserved(
        &self,
        peeks: &[Hit<'_>],
        reset: bool,
    ) -> Result<Vec<Option<u64>>, ServiceError> {
        let twins: Vec<Option<(String, Quota)>> = peeks
            .iter()
            .map(|h| super::reserve::reserved_twin(h.key, &h.quota))
            .collect();
        let twin_peeks: Vec<Hit<'_>> = twins
            .iter()
            .flatten()
            .map(|(key, quota)| Hit {
                key,
                quota: *quota,
                hits: 0,
            })
            .collect();
        if twin_peeks.is_empty() {
            return Ok(vec![None; peeks.len()]);
        }
        if reset {
            let now = Timestamp::from_nanos(self.clock.now_nanos());
            self.store.reset(now, &twin_peeks).await?;
        }
        let mut states = self.peek(&twin_peeks).await?.into_iter();
        Ok(twins
            .iter()
            .map(|t| {
                t.as_ref()
                    .and_then(|_| states.next())
                    .map(|d| d.count_before)
            })
            .collect())
    }

    /// The store's answer to `peeks` (hits of 0: nothing is counted), one per peek.
    async fn peek(&self, peeks: &[Hit<'_>]) -> Result<Vec<Decision>, ServiceError> {
        let now = Timestamp::from_nanos(self.clock.now_nanos());
        let mut states = Vec::with_capacity(peeks.len());
        self.store.apply(now, peeks, &mut states).await?;
        if states.len() != peeks.len() {
            let (expected, got) = (peeks.len(), states.len());
            return Err(crate::store::StoreError::BadReply { expected, got }.into());
        }
        Ok(states)
    }
}

/// A quota's settings as the admin's JSON shows them.
fn quota_json(q: &Quota) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert("algorithm".into(), q.algorithm.name().into());
    m.insert("unit".into(), q.unit.name().into());
    m.insert("unit_multiplier".into(), q.unit_multiplier.into());
    m.insert("requests_per_unit".into(), q.requests_per_unit.into());
    m.insert("burst".into(), q.burst.map(NonZeroU32::get).into());
    m.insert("charge_refused".into(), q.charges_refused().into());
    if let Some(p) = q.penalty {
        m.insert("penalty_seconds".into(), p.secs.get().into());
        m.insert("penalty_extends".into(), p.extends.into());
    }
    m
}

/// One counter as `/debug/counters` and `sluice explain` show it: its key, limit and quota,
/// and its state when it was read.
pub(crate) fn counter_json(v: &CounterView) -> Value {
    let mut m = quota_json(&v.quota);
    m.insert("descriptor".into(), v.descriptor.into());
    m.insert("key".into(), v.key.clone().into());
    m.insert("limit".into(), v.limit.clone().into());
    m.insert("name".into(), v.name.clone().into());
    m.insert("source".into(), v.source.into());
    m.insert("count".into(), v.state.count_before.into());
    // What settled requests and plain hits used, and what open reservations hold, of `count`.
    if let Some(reserved) = v.reserved {
        let used = v.state.count_before.saturating_sub(reserved);
        m.insert("used".into(), used.into());
        m.insert("reserved".into(), reserved.into());
    }
    m.insert("remaining".into(), v.state.remaining.into());
    m.insert("reset_after_secs".into(), v.state.reset_after_secs.into());
    m.insert("over".into(), v.state.over.into());
    insert_penalized(&mut m, &v.state);
    Value::Object(m)
}

/// `penalized: true` for a counter in its penalty, whose `reset_after_secs` is then when the
/// penalty ends and whose `count` was not read.
fn insert_penalized(m: &mut serde_json::Map<String, Value>, state: &Decision) {
    if state.penalized {
        m.insert("penalized".into(), true.into());
    }
}

/// The decision `hits` would get from a counter whose peek (0 hits) answered `peek`: refused
/// when they are more than it has room for, as every algorithm decides, or in a penalty.
fn would_get(peek: &Decision, hits: u64) -> Decision {
    if hits == 0 {
        return *peek;
    }
    let over = peek.penalized || hits > u64::from(peek.remaining);
    Decision {
        count_after: peek.count_before.saturating_add(hits),
        over,
        remaining: if over {
            0
        } else {
            peek.remaining - u32::try_from(hits).unwrap_or(u32::MAX)
        },
        ..*peek
    }
}

/// Why a descriptor whose walk is `steps` matched no limit, in words.
fn no_match_reason(request: &Descriptor, steps: &[Step<'_>]) -> String {
    let entry = |i: usize| {
        request
            .entries
            .get(i)
            .map_or(String::new(), |e| format!("{}={}", e.key, e.value))
    };
    match steps.last() {
        None => "the descriptor has no entries".to_owned(),
        Some(Step {
            entry: i,
            matched: None,
        }) => format!(
            "nothing at level {} matches `{}`: no node `key_value` or `key`, and no wildcard",
            i + 1,
            entry(*i)
        ),
        Some(Step {
            entry: i,
            matched: Some(m),
        }) if *i + 1 < request.entries.len() => format!(
            "`{}` matched node `{}` at level {}, which has no level below: `{}` and later entries \
             cannot match, so the descriptor matches nothing (as in the Go service)",
            entry(*i),
            m.node,
            i + 1,
            entry(i + 1)
        ),
        Some(Step {
            matched: Some(m), ..
        }) => format!(
            "the last entry matched node `{}`, which has no rate_limit of its own",
            m.node
        ),
    }
}

impl<S: CounterStore> RateLimitService<S> {
    /// What `ShouldRateLimit` would do with `request`, without counting anything, as JSON:
    /// for each descriptor the walk through the config (which node matched each entry, and
    /// how), the limit, `replaces`, shadow and quota mode, the counter keys; with `counters`,
    /// each counter's state (read with a peek of 0 hits) and the answer the request would get.
    pub async fn explain(&self, request: &Request, counters: bool) -> Result<Value, ServiceError> {
        let guard = self.config.guard();
        self.explain_in(guard.as_deref(), request, counters).await
    }

    /// [`RateLimitService::explain`] on `config` rather than the one served (a runtime limit's
    /// dry run: the config as it would be after the change).
    pub(crate) async fn explain_in(
        &self,
        config: Option<&RateLimitConfig>,
        request: &Request,
        counters: bool,
    ) -> Result<Value, ServiceError> {
        self.check_caps(request)?;
        let config = config.ok_or(ServiceError::NoConfig)?;
        let Some(domain) = config.domain(&request.domain) else {
            return Ok(json!({
                "domain": request.domain,
                "domain_loaded": false,
                "overall_code": "OK",
                "why": "no loaded config has this domain: every descriptor answers OK, uncounted",
            }));
        };
        let matched = plan::plan(domain, request);
        let mut plans = plan::plan(domain, request);
        plan::apply_replaces(&mut plans);
        let mut keys = String::new();
        let keys = plan::counter_keys(&self.options, request, &plans, &mut keys)?;
        let hits = plan::hits(&plans, &keys);
        let peeks: Vec<Hit<'_>> = hits.iter().map(|h| Hit { hits: 0, ..*h }).collect();
        let states = if counters {
            self.peek(&peeks).await?
        } else {
            Vec::new()
        };
        let mut at = 0;
        let mut out = Vec::with_capacity(request.descriptors.len());
        for (i, (d, plan)) in request.descriptors.iter().zip(&plans).enumerate() {
            let mut desc = walk_json(domain, i, d);
            if matches!(plan, Plan::Pass)
                && let Some(l) = matched[i].config_limit()
            {
                desc["replaced_by"] = replaced_by(&matched, l).into();
            }
            if let Plan::Counted { limit, hits, .. } = plan {
                let n = limit.quota_count();
                let read = states.get(at..at + n).unwrap_or_default();
                desc["hits"] = (*hits).into();
                desc["counters"] = counters_json(&peeks[at..at + n], read, *hits);
                at += n;
            }
            out.push(desc);
        }
        let mut answer = json!({
            "domain": request.domain,
            "domain_loaded": true,
            "descriptors": out,
        });
        if counters {
            self.verdict(domain, request, &plans, (&hits, &states), &mut answer);
        }
        Ok(answer)
    }

    /// The answer the request would get from counters in `states` (a peek each): every
    /// descriptor's code, the overall code, and global shadow mode's part, into `answer`.
    fn verdict(
        &self,
        domain: &Domain,
        request: &Request,
        plans: &[Plan<'_>],
        (hits, states): (&[Hit<'_>], &[Decision]),
        answer: &mut Value,
    ) {
        let would: Vec<Decision> = hits
            .iter()
            .zip(states)
            .map(|(h, s)| would_get(s, h.hits))
            .collect();
        let (statuses, quota) = self.outcome(domain, request, plans, &would, false);
        let descriptors = answer["descriptors"].as_array_mut().into_iter().flatten();
        for (desc, s) in descriptors.zip(&statuses) {
            desc["code"] = code_name(s.code).into();
        }
        let overall = super::plan::overall_code(&statuses, &quota);
        answer["overall_code"] = code_name(overall).into();
        if self.options.shadow_mode && overall == super::Code::OverLimit {
            answer["global_shadow_mode"] =
                "SHADOW_MODE is on: the answer would be OK, counted as over".into();
        }
    }
}

/// Descriptor `i`'s entries and its walk through `domain` (or its override), with the limit
/// it matched or why none.
fn walk_json(domain: &Domain, i: usize, d: &Descriptor) -> Value {
    let mut desc = json!({
        "index": i,
        "entries": d.entries.iter().map(|e| format!("{}={}", e.key, e.value)).collect::<Vec<_>>(),
    });
    if let Some(o) = d.limit_override {
        desc["override"] = json!({"requests_per_unit": o.requests_per_unit, "unit": o.unit.name()});
        return desc;
    }
    let (steps, found) = domain.explain(&d.entries);
    desc["path"] = steps_json(d, &steps);
    match found {
        Some(m) => desc["limit"] = limit_json(m.limit),
        None => desc["why"] = no_match_reason(d, &steps).into(),
    }
    desc
}

/// A descriptor's counters: key and quota, and when they were read (`states`, a peek each)
/// their state and whether `hits` more would be refused.
fn counters_json(peeks: &[Hit<'_>], states: &[Decision], hits: u64) -> Value {
    let view = |(j, peek): (usize, &Hit<'_>)| {
        let mut c = quota_json(&peek.quota);
        c.insert("key".into(), peek.key.into());
        if let Some(s) = states.get(j) {
            c.insert("count".into(), s.count_before.into());
            c.insert("remaining".into(), s.remaining.into());
            c.insert("reset_after_secs".into(), s.reset_after_secs.into());
            c.insert("would_refuse".into(), would_get(s, hits).over.into());
            insert_penalized(&mut c, s);
        }
        Value::Object(c)
    };
    Value::Array(peeks.iter().enumerate().map(view).collect())
}

fn code_name(code: super::Code) -> &'static str {
    match code {
        super::Code::OverLimit => "OVER_LIMIT",
        _ => "OK",
    }
}

/// The walk of one descriptor, level by level.
fn steps_json(d: &Descriptor, steps: &[Step<'_>]) -> Value {
    let step = |s: &Step<'_>| {
        let entry = d
            .entries
            .get(s.entry)
            .map_or(String::new(), |e| format!("{}={}", e.key, e.value));
        match &s.matched {
            None => json!({"level": s.entry + 1, "entry": entry, "matched": null}),
            Some(m) => json!({
                "level": s.entry + 1,
                "entry": entry,
                "matched": m.node,
                "how": m.how,
                "limit": m.limit.map(|l| l.full_key.as_str()),
                "has_children": m.has_children,
            }),
        }
    };
    Value::Array(steps.iter().map(step).collect())
}

/// A matched limit's settings.
fn limit_json(l: &Limit) -> Value {
    let blocks: Vec<Value> = match &l.rule {
        Rule::Unlimited => Vec::new(),
        Rule::Limited(blocks) => blocks
            .iter()
            .map(|b| {
                let mut m = quota_json(&b.quota);
                m.insert("name".into(), b.name.clone().into());
                Value::Object(m)
            })
            .collect(),
    };
    json!({
        "full_key": l.full_key,
        "name": l.name,
        "unlimited": matches!(l.rule, Rule::Unlimited),
        "blocks": blocks,
        "shadow_mode": l.shadow_mode,
        "quota_mode": l.quota_mode,
        "replaces": l.replaces,
        "source": l.source.name(),
    })
}

/// The limits of the request's other descriptors whose `replaces` name `limit`.
fn replaced_by(matched: &[Plan<'_>], limit: &Limit) -> Vec<String> {
    matched
        .iter()
        .filter_map(Plan::config_limit)
        .filter(|other| {
            other
                .replaces
                .iter()
                .any(|r| limit.names().any(|n| n == r.as_str()))
        })
        .map(|other| other.full_key.clone())
        .collect()
}
