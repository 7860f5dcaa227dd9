//! Builds the compiled config ([`super::lookup`]) from parsed files: the Go service's checks in
//! its order (empty keys, duplicate composite keys, units, replaces, share_threshold, metadata),
//! then Sluice's extensions (`algorithm`, `burst`, `rate_limits`, ...), one tree per domain.

use super::StatsSlot;
use super::limit::{Block, Limit, Rule, Source};
use super::lookup::{Domain, FastMap, Level, Node, RateLimitConfig, check_pattern};
use super::raw::{RawDescriptor, RawRateLimit, RawRoot, go_format};
use crate::limiter::{Algorithm, Calendar, Penalty, Quota, Unit, Window, concurrency};
use serde_yaml_ng::Value as Yaml;
use std::num::NonZeroU32;

/// Builds a [`RateLimitConfig`] file by file, as Go's `loadConfig` does.
#[derive(Debug)]
pub(crate) struct Builder {
    /// Each domain's tree, by name.
    domains: FastMap<String, Level>,
    merge_domain_config: bool,
    /// The calendar of a `unit: month` limit without a `time_zone` (USE_CALENDAR_MONTH_RATE_LIMIT).
    month: Calendar,
}

impl Builder {
    pub(crate) fn new(opts: &super::LoadOptions) -> Self {
        Builder {
            domains: FastMap::default(),
            merge_domain_config: opts.merge_domain_config,
            month: if opts.calendar_month {
                Calendar::GO_MONTH
            } else {
                Calendar::EPOCH
            },
        }
    }

    /// Adds one parsed file. On error nothing of the file is kept, so later files' errors are
    /// their own and not echoes of this one.
    pub(crate) fn add_file(&mut self, root: RawRoot) -> Result<(), String> {
        if root.domain.is_empty() {
            return Err("config file cannot have empty domain".to_owned());
        }
        let parent = format!("{}.", root.domain);
        if let Some(existing) = self.domains.get_mut(&root.domain) {
            if !self.merge_domain_config {
                return Err(format!("duplicate domain '{}' in config file", root.domain));
            }
            let before = existing.nodes.len();
            let result = load_descriptors(existing, &parent, root.descriptors, self.month);
            if result.is_err() {
                existing.truncate(before);
            }
            mark_stats_keys(existing, PathStats::default());
            return result;
        }
        let mut level = Level::default();
        load_descriptors(&mut level, &parent, root.descriptors, self.month)?;
        mark_stats_keys(&mut level, PathStats::default());
        self.domains.insert(root.domain, level);
        Ok(())
    }

    pub(crate) fn finish(self) -> RateLimitConfig {
        RateLimitConfig {
            domains: self
                .domains
                .into_iter()
                .map(|(name, level)| (name.clone(), Domain::new(name, level)))
                .collect(),
        }
    }
}

impl Level {
    /// Removes the nodes from `len` on (undoing a failed file's additions when merging).
    fn truncate(&mut self, len: usize) {
        for n in self.nodes.drain(len.min(self.nodes.len())..) {
            self.index.remove(&n.composite);
        }
        self.wildcards.truncate(len);
    }
}

/// What the levels above a node say about the stats keys of the limits below it.
#[derive(Clone, Copy, Default)]
struct PathStats {
    /// An ancestor has `value_to_metric`: the key is built per request.
    varies: bool,
    /// An ancestor is matched by key only, or by a wildcard that shares no counter, and its
    /// segment of the stats key leaves the request's value out: the key covers many counters.
    hides_values: bool,
}

/// Sets [`Limit::stats_key_varies`] and [`Limit::stats_key_is_one_counter`] below `level`
/// (the segments `push_metric_segment` writes).
fn mark_stats_keys(level: &mut Level, above: PathStats) {
    for n in &mut level.nodes {
        let by_value = *n.composite != *n.key && (!n.composite.contains('*') || n.share_threshold);
        let path = PathStats {
            varies: above.varies || n.value_to_metric,
            hides_values: above.hides_values || (!by_value && !n.value_to_metric),
        };
        if let Some(l) = &mut n.limit {
            l.stats_key_varies = path.varies || l.detailed_metric;
            l.stats_key_is_one_counter = !path.hides_values || l.detailed_metric;
        }
        mark_stats_keys(&mut n.children, path);
    }
}

/// Go's `loadDescriptors`: the checks run in its order, depth first.
fn load_descriptors(
    level: &mut Level,
    parent_key: &str,
    descriptors: Vec<RawDescriptor>,
    month: Calendar,
) -> Result<(), String> {
    for d in descriptors {
        if d.key.is_empty() {
            return Err("descriptor has empty key".to_owned());
        }
        let composite = composite_of(&d)?;
        let full_key = format!("{parent_key}{composite}");
        if d.value_regex.is_none() && level.index.contains_key(composite.as_str()) {
            return Err(format!("duplicate descriptor composite key '{full_key}'"));
        }

        let limit = match (d.rate_limit, d.rate_limits) {
            (None, None) => None,
            (Some(_), Some(_)) => {
                return Err("descriptor cannot have both rate_limit and rate_limits".to_owned());
            }
            (Some(rl), None) => Some(single_limit(rl, month)?),
            (None, Some(list)) => Some(multi_limit(list, month)?),
        };
        let is_wildcard = d.value_regex.is_none() && composite.contains('*');
        if d.share_threshold && !is_wildcard && d.value_regex.is_none() {
            return Err(format!(
                "share_threshold can only be used with wildcard values (containing '*'), but found key '{composite}'"
            ));
        }

        let metadata = metadata_of(d.metadata.as_ref())?;
        let limit = limit.map(|(rule, name, replaces)| {
            Box::new(Limit {
                full_key: full_key.clone(),
                rule,
                name,
                replaces,
                shadow_mode: d.shadow_mode,
                quota_mode: d.quota_mode,
                detailed_metric: d.detailed_metric,
                value_to_metric: d.value_to_metric,
                metadata,
                stats_key_varies: false,
                stats_key_is_one_counter: false,
                stats: StatsSlot::default(),
                source: Source::Config,
            })
        });

        let mut children = Level::default();
        load_descriptors(&mut children, &format!("{full_key}."), d.descriptors, month)?;

        let i = level.nodes.len();
        let composite: Box<str> = composite.into();
        match &d.value_regex {
            // Matched only by its pattern: never by the index, whatever a value spells.
            Some(pattern) => level.wildcards.push_regex(i, &d.key, pattern)?,
            None => {
                level.index.insert(composite.clone(), i);
            }
        }
        if is_wildcard {
            level.wildcards.push(i, &composite);
        }
        level.nodes.push(Node {
            composite,
            key: d.key.as_str().into(),
            limit,
            share_threshold: d.share_threshold,
            value_to_metric: d.value_to_metric,
            children,
        });
    }
    level.wildcards.compile()
}

/// A descriptor's `metadata`, as the JSON its answers carry; `None` when absent or null.
fn metadata_of(metadata: Option<&Yaml>) -> Result<Option<serde_json::Value>, String> {
    match metadata {
        None | Some(Yaml::Null) => Ok(None),
        Some(m) => metadata_to_json(m)
            .map(Some)
            .map_err(|e| format!("error parsing metadata: {e}")),
    }
}

/// Go's map key of a descriptor at its level: `key`, or `key_value`; a `value_regex`
/// descriptor's is `key~pattern`, which no request's `key_value` is.
fn composite_of(d: &RawDescriptor) -> Result<String, String> {
    Ok(match (&d.value_regex, d.value.is_empty()) {
        (Some(_), false) => {
            return Err(format!(
                "descriptor '{}' has both value and value_regex: give one",
                d.key
            ));
        }
        (Some(pattern), true) => {
            check_pattern(pattern)?;
            format!("{}~{pattern}", d.key)
        }
        (None, true) => d.key.clone(),
        (None, false) => format!("{}_{}", d.key, d.value),
    })
}

/// A descriptor's limit before it is placed: its rule, name and `replaces`.
type LimitParts = (Rule, String, Vec<String>);

/// A `rate_limit:` block: Go's checks, in Go's order, then the Sluice extensions'.
fn single_limit(rl: RawRateLimit, month: Calendar) -> Result<LimitParts, String> {
    let rule = if rl.unlimited {
        if Unit::from_name(&rl.unit).is_some() {
            return Err("should not specify rate limit unit when unlimited".to_owned());
        }
        if rl.algorithm.is_some()
            || rl.burst.is_some()
            || rl.charge_refused.is_some()
            || rl.unit_multiplier.is_some()
            || rl.safe_capacity.is_some()
            || rl.time_zone.is_some()
            || rl.week_start.is_some()
            || rl.penalty_seconds.is_some()
            || rl.penalty_extends.is_some()
        {
            return Err(
                "should not specify algorithm, burst, charge_refused, unit_multiplier, \
                 safe_capacity, time_zone, week_start, penalty_seconds or penalty_extends \
                 when unlimited"
                    .to_owned(),
            );
        }
        Rule::Unlimited
    } else {
        Rule::Limited(Box::new([block(&rl, month)?]))
    };
    check_replaces(&rl, &[rl.name.as_str()])?;
    let replaces = rl.replaces.into_iter().map(|r| r.name).collect();
    Ok((rule, rl.name, replaces))
}

/// A `rate_limits:` list: each element is checked as a `rate_limit` block, but may not be
/// unlimited (an unlimited element would make the others pointless).
fn multi_limit(list: Vec<RawRateLimit>, month: Calendar) -> Result<LimitParts, String> {
    if list.is_empty() {
        return Err("rate_limits must not be empty".to_owned());
    }
    // A block may not replace any limit of its own descriptor, not just itself.
    let names: Vec<&str> = list.iter().map(|rl| rl.name.as_str()).collect();
    let mut blocks = Vec::with_capacity(list.len());
    let mut replaces: Vec<String> = Vec::new();
    for rl in &list {
        if rl.unlimited {
            return Err("unlimited is not allowed inside rate_limits".to_owned());
        }
        blocks.push(block(rl, month)?);
        check_replaces(rl, &names)?;
        for r in &rl.replaces {
            if !replaces.contains(&r.name) {
                replaces.push(r.name.clone());
            }
        }
    }
    Ok((
        Rule::Limited(blocks.into_boxed_slice()),
        String::new(),
        replaces,
    ))
}

/// One limited block: unit (Go's check), then algorithm, burst and charge_refused.
fn block(rl: &RawRateLimit, month: Calendar) -> Result<Block, String> {
    let unit = Unit::from_name(&rl.unit)
        .ok_or_else(|| format!("invalid rate limit unit '{}'", rl.unit))?;
    let algorithm = match &rl.algorithm {
        None => Algorithm::FixedWindow,
        Some(name) => Algorithm::from_name(name)
            .ok_or_else(|| format!("invalid rate limit algorithm '{name}'"))?,
    };
    let burst = match rl.burst {
        None => None,
        Some(_) if !algorithm.takes_burst() => {
            return Err(format!(
                "burst can only be used with token_bucket or leaky_bucket, not '{}'",
                algorithm.name()
            ));
        }
        Some(n) => Some(
            NonZeroU32::new(n)
                .ok_or_else(|| "burst must be at least 1 (omit it for the default)".to_owned())?,
        ),
    };
    check_concurrency(rl, algorithm)?;
    let charge_refused = match rl.charge_refused {
        Some(false) if algorithm == Algorithm::FixedWindow => {
            return Err(
                "charge_refused cannot be false for 'fixed_window', which counts \
                 every hit as the Go service does (choose another algorithm to drop refused hits)"
                    .to_owned(),
            );
        }
        // A fixed window counts refused hits anyway, but `true` there says more: every one of
        // its hits is counted even where the Go service's shortcuts would hold refused ones
        // back (the local over-limit cache, the STOP flag, a lease), so that a refund sent
        // for a refused request gives back only what it took (docs/algorithms.md, Refunds).
        // A concurrency limit keeps refused starts as a debt unless told its proxy refunds
        // admitted requests only (`charge_refused: false`, HAProxy's response event).
        charge => charge.unwrap_or(algorithm == Algorithm::Concurrency),
    };
    let unit_multiplier = match rl.unit_multiplier {
        None => 1,
        Some(0) => return Err("unit_multiplier must be at least 1 (omit it for 1)".to_owned()),
        Some(n) if Window::new(unit, n).secs() > Window::MAX_SECS => {
            return Err(format!(
                "unit_multiplier {n} makes a window of {} seconds; the most is {} (about 136 years)",
                u128::from(unit.secs()) * u128::from(n),
                Window::MAX_SECS
            ));
        }
        Some(n) => n,
    };
    Ok(Block {
        quota: Quota {
            penalty: penalty(rl)?,
            requests_per_unit: rl.requests_per_unit,
            unit,
            unit_multiplier,
            calendar: calendar(rl, unit, algorithm, month)?,
            algorithm,
            burst,
            charge_refused,
            safe_capacity: safe_capacity(rl)?,
        },
        name: rl.name.clone(),
    })
}

/// The longest `penalty_seconds`: a year.
pub(crate) const MAX_PENALTY_SECS: u32 = 366 * 86_400;

/// A block's `penalty_seconds` and `penalty_extends`.
fn penalty(rl: &RawRateLimit) -> Result<Option<Penalty>, String> {
    match (rl.penalty_seconds, rl.penalty_extends) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err("penalty_extends needs penalty_seconds".to_owned()),
        (Some(n), _) if n > MAX_PENALTY_SECS => Err(format!(
            "penalty_seconds {n} is longer than a year ({MAX_PENALTY_SECS})"
        )),
        (Some(n), extends) => {
            let secs = NonZeroU32::new(n).ok_or_else(|| {
                "penalty_seconds must be at least 1 (omit it for no penalty)".to_owned()
            })?;
            Ok(Some(Penalty {
                secs,
                extends: extends.unwrap_or(false),
            }))
        }
    }
}

/// A block's calendar: its `time_zone` and `week_start`, else `month` for a `unit: month`
/// (USE_CALENDAR_MONTH_RATE_LIMIT), else epoch windows.
fn calendar(
    rl: &RawRateLimit,
    unit: Unit,
    algorithm: Algorithm,
    month: Calendar,
) -> Result<Calendar, String> {
    let Some(zone) = &rl.time_zone else {
        if rl.week_start.is_some() {
            return Err("week_start needs a time_zone (for UTC weeks, time_zone: UTC)".to_owned());
        }
        return Ok(
            if unit == Unit::Month && !month.is_epoch() && is_window(algorithm) {
                month
            } else {
                Calendar::EPOCH
            },
        );
    };
    if unit < Unit::Day {
        return Err(format!(
            "time_zone '{zone}' needs a unit of day, week, month or year, not {}",
            unit.name().to_lowercase()
        ));
    }
    if !is_window(algorithm) {
        return Err(format!(
            "time_zone '{zone}' can only be used with fixed_window or sliding_window, not '{}'",
            algorithm.name()
        ));
    }
    if rl.week_start.is_some() && unit != Unit::Week {
        return Err(format!(
            "week_start needs unit: week, not {}",
            unit.name().to_lowercase()
        ));
    }
    Calendar::zone(zone, rl.week_start.as_deref())
}

/// Whether `algorithm` counts in windows (which a calendar can place).
fn is_window(algorithm: Algorithm) -> bool {
    matches!(algorithm, Algorithm::FixedWindow | Algorithm::SlidingWindow)
}

/// A concurrency limit's own check: at most [`concurrency::MAX_SLOTS`] slots.
fn check_concurrency(rl: &RawRateLimit, algorithm: Algorithm) -> Result<(), String> {
    if algorithm != Algorithm::Concurrency {
        return Ok(());
    }
    if rl.requests_per_unit > concurrency::MAX_SLOTS {
        return Err(format!(
            "requests_per_unit {} is more slots than a concurrency limit may hold (at most {})",
            rl.requests_per_unit,
            concurrency::MAX_SLOTS
        ));
    }
    Ok(())
}

/// `safe_capacity`: at least 1 and at most the limit (a partitioned peer never gets more than
/// the whole cluster).
fn safe_capacity(rl: &RawRateLimit) -> Result<Option<NonZeroU32>, String> {
    match rl.safe_capacity {
        None => Ok(None),
        Some(0) => Err(
            "safe_capacity must be at least 1 (omit it for the limit divided by the number of \
             peers)"
                .to_owned(),
        ),
        Some(n) if n > rl.requests_per_unit => Err(format!(
            "safe_capacity {n} is more than the limit ({} requests_per_unit): it is what one \
             peer may admit alone, a part of the limit",
            rl.requests_per_unit
        )),
        Some(n) => Ok(NonZeroU32::new(n)),
    }
}

/// Go's `replaces` checks; `own` holds the names of the descriptor's own limits ("" entries are
/// caught first, as in Go, so an unnamed limit never matches).
fn check_replaces(rl: &RawRateLimit, own: &[&str]) -> Result<(), String> {
    for r in &rl.replaces {
        if r.name.is_empty() {
            return Err("should not have an empty replaces entry".to_owned());
        }
        if own.contains(&r.name.as_str()) {
            return Err("replaces should not contain name of same descriptor".to_owned());
        }
    }
    Ok(())
}

/// Converts descriptor `metadata` to JSON: a map with string keys whose values are any JSON
/// value (what a protobuf Struct, which Go builds from it, can hold).
fn metadata_to_json(v: &Yaml) -> Result<serde_json::Value, String> {
    match v {
        Yaml::Mapping(_) => yaml_to_json(v),
        other => Err(format!(
            "metadata must be a map, found '{}'",
            go_format(other)
        )),
    }
}

fn yaml_to_json(v: &Yaml) -> Result<serde_json::Value, String> {
    use serde_json::Value as Json;
    Ok(match v {
        Yaml::Null => Json::Null,
        Yaml::Bool(b) => Json::Bool(*b),
        Yaml::Number(n) => {
            if let Some(i) = n.as_i64() {
                Json::from(i)
            } else if let Some(u) = n.as_u64() {
                Json::from(u)
            } else {
                let f = n.as_f64().unwrap_or(f64::NAN);
                serde_json::Number::from_f64(f)
                    .map(Json::Number)
                    .ok_or_else(|| format!("invalid number '{n}'"))?
            }
        }
        Yaml::String(s) => Json::String(s.clone()),
        Yaml::Sequence(items) => {
            Json::Array(items.iter().map(yaml_to_json).collect::<Result<_, _>>()?)
        }
        Yaml::Mapping(m) => {
            let mut out = serde_json::Map::new();
            for (k, v) in m {
                let Yaml::String(k) = k else {
                    return Err(format!("key is not of type string: {}", go_format(k)));
                };
                out.insert(k.clone(), yaml_to_json(v)?);
            }
            Json::Object(out)
        }
        Yaml::Tagged(t) => return Err(format!("unsupported tagged value '{}'", t.tag)),
    })
}
