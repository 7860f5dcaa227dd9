//! A compiled limit: its rule (one or more quota blocks, or unlimited), names, modes and
//! where it was set. The YAML's tree ([`super::lookup`]) and the runtime limits' layer
//! ([`super::runtime_layer`]) both hold these.

use super::StatsSlot;
use crate::limiter::Quota;

/// A limit's rule: one or more quotas, or no limit at all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Always OK; the backend is never touched.
    Unlimited,
    /// Every block is enforced; `rate_limit:` gives one block, `rate_limits:` one or more.
    /// Never empty: the builder rejects `rate_limits: []`.
    Limited(Box<[Block]>),
}

/// One enforced quota of a limit: a `rate_limit` block, or one element of `rate_limits`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    /// requests_per_unit, unit, algorithm and burst.
    pub quota: Quota,
    /// This block's `name`, "" if none (reported as `current_limit.name` when it is the most
    /// restrictive).
    pub name: String,
}

/// One configured limit: a descriptor node with a `rate_limit` (or `rate_limits`) block.
#[derive(Clone, Debug, PartialEq)]
pub struct Limit {
    /// Go's FullKey and stats key: the config path, e.g. `domain.key_value.key2`.
    pub full_key: String,
    pub rule: Rule,
    /// `rate_limit.name`, "" if none, as in Go (`replaces` entries name it). Always "" for
    /// `rate_limits`, whose names live in the blocks; see [`Limit::names`].
    pub name: String,
    /// What this limit knocks out: `rate_limit.replaces`, or the union of the blocks'
    /// `replaces` for `rate_limits` (in YAML order, without repeats).
    pub replaces: Vec<String>,
    pub shadow_mode: bool,
    /// The YAML `quota_mode` only; the global QUOTA_MODE is applied by the caller.
    pub quota_mode: bool,
    pub detailed_metric: bool,
    pub value_to_metric: bool,
    /// The descriptor's `metadata`, as JSON (for dynamic metadata).
    pub metadata: Option<serde_json::Value>,
    /// Whether the stats key depends on the request's values (`detailed_metric` here, or
    /// `value_to_metric` on this node or an ancestor), so it must be built per request with
    /// [`Domain::stats_key`]; otherwise it is `full_key`.
    pub stats_key_varies: bool,
    /// Whether each of this limit's stats keys counts one counter: every level of its path
    /// is matched by value (or shared by a `share_threshold` wildcard), or the key shows the
    /// request's values (`detailed_metric`, `value_to_metric`). Otherwise (a key-only or
    /// wildcard level whose value the key leaves out) one stats key sums the counters of every
    /// value, and its hits cannot be compared with the limit, which is each counter's.
    pub stats_key_is_one_counter: bool,
    /// The link to this limit's counters, filled by the first request that counts.
    pub stats: StatsSlot,
    /// Where the limit was set: the YAML (or xDS) config, or the runtime API.
    pub source: Source,
}

/// Where a limit was set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Source {
    /// The YAML files, or xDS.
    #[default]
    Config,
    /// The runtime limits API (`PUT /limits/...` on the debug port).
    Runtime,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Config => "config",
            Source::Runtime => "runtime",
        }
    }
}

impl Limit {
    /// Every name another limit's `replaces` can knock this one out by: [`Limit::name`] and the
    /// blocks' names, non-empty, each once.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        let blocks: &[Block] = match &self.rule {
            Rule::Unlimited => &[],
            Rule::Limited(blocks) => blocks,
        };
        let own = Some(self.name.as_str()).filter(|n| !n.is_empty());
        own.into_iter().chain(
            blocks
                .iter()
                .enumerate()
                .map(|(i, b)| (i, b.name.as_str()))
                .filter(move |&(i, n)| {
                    // A single `rate_limit` names both the limit and its block.
                    !n.is_empty() && n != self.name && !blocks[..i].iter().any(|b| b.name == n)
                })
                .map(|(_, n)| n),
        )
    }

    /// The block that binds when requests come steadily: the lowest sustained rate,
    /// requests_per_unit over the window's length (the first of equals); `None` when unlimited.
    pub(crate) fn slowest_block(&self) -> Option<&Quota> {
        let Rule::Limited(blocks) = &self.rule else {
            return None;
        };
        // a/w < b/v, in integers: a × v < b × w.
        let rate = |q: &Quota| {
            (
                u128::from(q.requests_per_unit),
                u128::from(q.window().secs()),
            )
        };
        blocks.iter().map(|b| &b.quota).reduce(|slowest, q| {
            let ((a, w), (b, v)) = (rate(slowest), rate(q));
            if b * w < a * v { q } else { slowest }
        })
    }
}
