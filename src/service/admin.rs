//! The counter admin behind the debug port's `/debug/counters`: a request's counters as they
//! stand (every quota each descriptor would be charged against, with the store's answer to a
//! peek of 0 hits, so nothing is counted) and their reset. It resolves descriptors exactly as
//! `ShouldRateLimit` does (overrides, `share_threshold`, key prefix, `#<index>_` for later
//! `rate_limits` blocks); `replaces` is not applied, so a replaced limit can still be read and
//! reset. On a peer cluster the store takes each counter to its owner, as for a charge.

use crate::clock::Timestamp;
use crate::descriptor::Request;
use crate::limiter::{Decision, Quota};
use crate::store::{CounterStore, Hit};

use super::plan::{self, Plan};
use super::{RateLimitService, ServiceError};

/// One counter of a request, as the admin shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterView {
    /// The request descriptor it belongs to.
    pub descriptor: usize,
    /// The counter key stem, as the stores name it (`domain_key_value_...`).
    pub key: String,
    /// The matched limit's config path (`domain.key_value`), "" for a request override.
    pub limit: String,
    /// The block's name, else the limit's ("" for none).
    pub name: String,
    pub quota: Quota,
    /// The store's answer to a peek of 0 hits: `count_before` is what the counter holds (a
    /// bucket's in hits not yet drained), `over` what a check of 0 hits answers.
    pub state: Decision,
}

impl<S: CounterStore> RateLimitService<S> {
    /// Every counter `request` would be charged against, read without counting. A domain
    /// that is not loaded, or descriptors that match no counted limit, give none.
    pub async fn inspect_counters(
        &self,
        request: &Request,
    ) -> Result<Vec<CounterView>, ServiceError> {
        self.counters(request, false).await
    }

    /// Forgets every counter `request` would be charged against (on its owner, in a
    /// cluster), then reads them as [`RateLimitService::inspect_counters`] does.
    pub async fn reset_counters(
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
        let now = Timestamp::from_nanos(self.clock.now_nanos());
        if reset {
            self.store.reset(now, &peeks).await?;
        }
        let mut states = Vec::with_capacity(peeks.len());
        self.store.apply(now, &peeks, &mut states).await?;
        if states.len() != peeks.len() {
            let (expected, got) = (peeks.len(), states.len());
            return Err(crate::store::StoreError::BadReply { expected, got }.into());
        }
        let mut views = Vec::with_capacity(peeks.len());
        let mut at = peeks.iter().zip(states);
        for (descriptor, plan) in plans.iter().enumerate() {
            let Plan::Counted { limit, .. } = plan else {
                continue;
            };
            for ((_, block_name), (hit, state)) in limit.quotas().zip(at.by_ref()) {
                views.push(CounterView {
                    descriptor,
                    key: hit.key.to_owned(),
                    limit: limit.rule.map_or(String::new(), |l| l.full_key.clone()),
                    name: limit.name_for(block_name).to_owned(),
                    quota: hit.quota,
                    state,
                });
            }
        }
        Ok(views)
    }
}
