//! The validated, compiled config and its request-time lookup.
//!
//! The builder validates raw descriptors with the Go service's checks, in its order, and builds
//! one tree per domain. Each tree level holds its nodes in YAML order plus a hash index keyed by
//! Go's composite key (`key` or `key_value`) and the list of wildcard nodes, so matching one
//! request entry is one hash probe, then (rarely) a scan of the wildcard patterns, then one more
//! probe.

use super::StatsSlot;
use super::raw::{RawDescriptor, RawRateLimit, RawRoot, go_format};
use crate::descriptor::Entry;
use crate::limiter::{Algorithm, Quota, Unit, Window, concurrency};
use serde_yaml_ng::Value as Yaml;
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::num::NonZeroU32;

type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

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
    pub fn slowest_block(&self) -> Option<&Quota> {
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

/// The result of matching one request descriptor against a domain.
#[derive(Clone, Debug, PartialEq)]
pub struct Matched<'a> {
    pub limit: &'a Limit,
    /// Entries matched by a wildcard node with `share_threshold: true`: (entry index, the
    /// pattern's value *including* the `*`). The counter key uses the pattern so every matching
    /// value shares one counter (Go key `domain_files_files/*_1234`). Empty, and so not
    /// allocated, in the common case.
    pub shared_values: Vec<(usize, &'a str)>,
}

/// A whole loaded config: every domain of every file.
#[derive(Debug, Default)]
pub struct RateLimitConfig {
    domains: FastMap<String, Domain>,
}

impl RateLimitConfig {
    /// A config with no domains (an empty config directory loads as this, as in Go).
    pub fn empty() -> Self {
        Self::default()
    }

    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    pub fn domain_count(&self) -> usize {
        self.domains.len()
    }

    /// The domains, in no particular order.
    pub fn domains(&self) -> impl Iterator<Item = &Domain> {
        self.domains.values()
    }

    /// Every limit of every domain, in no particular order.
    pub fn limits(&self) -> impl Iterator<Item = &Limit> {
        let mut out = Vec::new();
        for d in self.domains.values() {
            d.root.collect_limits(&mut out);
        }
        out.into_iter()
    }

    /// The `/rlconfig` text: one line per limit, sorted by full key (Go prints map order; a
    /// sorted dump is stable to diff):
    /// `<fullkey>: unit=<UNIT> requests_per_unit=<n>, shadow_mode: <bool>, quota_mode: <bool>`.
    ///
    /// A limit with several blocks (`rate_limits`) has one line per block, in YAML order; a
    /// block that is not a plain fixed window adds `, algorithm: <name>` and, when set,
    /// `, burst: <n>` and `, charge_refused: true`. Fixed-window limits print exactly what Go
    /// prints.
    pub fn dump(&self) -> String {
        let mut limits: Vec<&Limit> = self.limits().collect();
        limits.sort_by(|a, b| a.full_key.cmp(&b.full_key));
        let mut out = String::new();
        for l in limits {
            match &l.rule {
                Rule::Unlimited => {
                    dump_prefix(&mut out, l, "UNKNOWN", 0);
                    out.push('\n');
                }
                Rule::Limited(blocks) => {
                    for b in blocks {
                        let q = &b.quota;
                        dump_prefix(&mut out, l, q.unit.name(), q.requests_per_unit);
                        if q.algorithm != Algorithm::FixedWindow {
                            let _ = write!(out, ", algorithm: {}", q.algorithm.name());
                        }
                        if let Some(burst) = q.burst {
                            let _ = write!(out, ", burst: {burst}");
                        }
                        if q.charge_refused {
                            out.push_str(", charge_refused: true");
                        }
                        if q.unit_multiplier > 1 {
                            let _ = write!(out, ", unit_multiplier: {}", q.unit_multiplier);
                        }
                        if let Some(safe) = q.safe_capacity {
                            let _ = write!(out, ", safe_capacity: {safe}");
                        }
                        out.push('\n');
                    }
                }
            }
        }
        out
    }
}

/// The Go-format start of one `/rlconfig` line, without its newline.
fn dump_prefix(out: &mut String, l: &Limit, unit: &str, requests_per_unit: u32) {
    // Writing to a String cannot fail.
    let _ = write!(
        out,
        "{}: unit={} requests_per_unit={}, shadow_mode: {}, quota_mode: {}",
        l.full_key, unit, requests_per_unit, l.shadow_mode, l.quota_mode
    );
}

/// One domain's descriptor tree.
#[derive(Debug)]
pub struct Domain {
    name: String,
    root: Level,
}

impl Domain {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Every limit of the domain with the descriptor keys on its path, root first.
    pub fn key_paths(&self) -> Vec<(Vec<&str>, &Limit)> {
        let mut out = Vec::new();
        self.root.collect_paths(&mut Vec::new(), &mut out);
        out
    }

    /// Go's `GetLimit` config-matching path (the per-request override is the service's job).
    ///
    /// Per level: the exact `key_value` node, else the first wildcard node (YAML order) whose
    /// pattern matches `key_value`, else the key-only node. The limit is returned only if the
    /// node matched by the *last* entry has one; matching stops, with no limit, at a node that
    /// has no children while entries remain.
    pub fn lookup(&self, entries: &[Entry]) -> Option<Matched<'_>> {
        // Go probes its map with a freshly built "key_value" string per entry. We reuse one
        // buffer per thread instead: the index is keyed by the same composite strings Go uses
        // (so every quirk of Go's matching, e.g. a key containing '_', carries over), and a
        // `HashMap<Box<str>, _>` can only be probed with a contiguous `&str`. A two-level
        // key -> value map would avoid the buffer but not reproduce Go's wildcard semantics,
        // which match patterns against the whole composite string.
        thread_local! {
            static PROBE: RefCell<String> = const { RefCell::new(String::new()) };
        }
        PROBE.with(|cell| match cell.try_borrow_mut() {
            Ok(mut buf) => self.lookup_with(entries, &mut buf, None, None),
            // Unreachable (lookup never re-enters itself), but never panic on a hot path.
            Err(_) => self.lookup_with(entries, &mut String::new(), None, None),
        })
    }

    /// The stats key Go's `GetLimit` gives the matched limit (`ratelimit.service.rate_limit.<key>`):
    ///
    /// - `detailed_metric` on the limit: every request entry as `key_value` (shared wildcard
    ///   entries keep their pattern);
    /// - otherwise the config path, except that levels matched by key only or by a wildcard
    ///   whose node has `value_to_metric` show the request's value instead.
    ///
    /// Allocates; call it only when recording stats. `None` when nothing matches.
    pub fn stats_key(&self, entries: &[Entry]) -> Option<String> {
        let mut buf = String::new();
        let mut enhanced = self.name.clone();
        let matched = self.lookup_with(entries, &mut buf, Some(&mut enhanced), None)?;
        if !matched.limit.detailed_metric {
            return Some(enhanced);
        }
        let mut key = self.name.clone();
        for (i, e) in entries.iter().enumerate() {
            key.push('.');
            key.push_str(&e.key);
            let shared = matched.shared_values.iter().find(|(j, _)| *j == i);
            if let Some((_, pattern)) = shared {
                key.push('_');
                key.push_str(pattern);
            } else if matched.shared_values.is_empty() || !e.value.is_empty() {
                // Go's detailed key always joins with '_', even for an empty value, unless
                // some entry is shared, in which case an empty value is left out.
                key.push('_');
                key.push_str(&e.value);
            }
        }
        Some(key)
    }

    /// How `entries` walk the descriptor tree, level by level, and what they match: what
    /// `sluice explain` shows. Allocates; the request path uses [`Domain::lookup`].
    pub fn explain(&self, entries: &[Entry]) -> (Vec<Step<'_>>, Option<Matched<'_>>) {
        let mut steps = Vec::new();
        let matched = self.lookup_with(entries, &mut String::new(), None, Some(&mut steps));
        (steps, matched)
    }

    /// The matching walk. `metric`, when given, receives Go's `value_to_metric` key segments;
    /// `trace` each level's step.
    fn lookup_with<'a>(
        &'a self,
        entries: &[Entry],
        buf: &mut String,
        mut metric: Option<&mut String>,
        mut trace: Option<&mut Vec<Step<'a>>>,
    ) -> Option<Matched<'a>> {
        let mut level = &self.root;
        let mut found: Option<&'a Limit> = None;
        let mut shared_values = Vec::new();
        let last = entries.len().checked_sub(1)?;
        for (i, entry) in entries.iter().enumerate() {
            let mut probe = Probe {
                entry,
                buf: &mut *buf,
                written: false,
            };
            let mut how = How::Exact;
            let mut node = level.exact(&mut probe);
            if node.is_none() {
                node = level.match_wildcard(&mut probe);
                if let Some(w) = node {
                    // Go trims "key_" off the pattern to get its value part.
                    let pattern = w
                        .composite
                        .strip_prefix(entry.key.as_str())
                        .and_then(|rest| rest.strip_prefix('_'))
                        .unwrap_or(&w.composite);
                    if w.share_threshold {
                        shared_values.push((i, pattern));
                    }
                    how = How::Wildcard(pattern);
                }
            }
            if node.is_none() {
                node = level.key_only(&entry.key);
                how = How::KeyOnly;
            }
            if let Some(t) = trace.as_deref_mut() {
                t.push(Step {
                    entry: i,
                    matched: node.map(|n| StepMatch {
                        node: &n.composite,
                        how: match how {
                            How::Exact => "exact",
                            How::Wildcard(_) if n.share_threshold => "wildcard, shared",
                            How::Wildcard(_) => "wildcard",
                            How::KeyOnly => "key only",
                        },
                        limit: n.limit.as_deref(),
                        has_children: !n.children.is_empty(),
                    }),
                });
            }
            let node = node?;
            if let Some(m) = metric.as_deref_mut() {
                push_metric_segment(m, entry, node, how);
            }
            if i == last {
                found = node.limit.as_deref();
            }
            if node.children.is_empty() {
                break;
            }
            level = &node.children;
        }
        found.map(|limit| Matched {
            limit,
            shared_values,
        })
    }
}

/// One level of [`Domain::explain`]'s walk: the request entry it looked at, and the node it
/// matched (`None`: nothing at this level matches, so the descriptor matches no limit).
#[derive(Clone, Debug, PartialEq)]
pub struct Step<'a> {
    pub entry: usize,
    pub matched: Option<StepMatch<'a>>,
}

/// The node a [`Step`] matched.
#[derive(Clone, Debug, PartialEq)]
pub struct StepMatch<'a> {
    /// The node's Go map key: `key`, or `key_value` when the YAML gives a value.
    pub node: &'a str,
    /// `exact` (the entry's `key_value`), `wildcard` (a `*` pattern, first in YAML order),
    /// `wildcard, shared` (with `share_threshold`: one counter for every value) or `key only`.
    pub how: &'static str,
    /// The node's own limit (it applies only when this is the request's last entry).
    pub limit: Option<&'a Limit>,
    /// Whether the node has a level below it (if not, later entries are not looked at and the
    /// descriptor matches nothing).
    pub has_children: bool,
}

/// How a level was matched.
#[derive(Clone, Copy)]
enum How<'a> {
    Exact,
    /// By a wildcard node; the pattern's value part.
    Wildcard(&'a str),
    KeyOnly,
}

/// One `.segment` of Go's `value_to_metric` stats key.
fn push_metric_segment(out: &mut String, entry: &Entry, node: &Node, how: How<'_>) {
    out.push('.');
    out.push_str(&entry.key);
    let show_value = match how {
        How::Exact => true,
        How::Wildcard(pattern) if node.share_threshold || !node.value_to_metric => {
            out.push('_');
            out.push_str(pattern);
            return;
        }
        How::Wildcard(_) => true,
        How::KeyOnly => node.value_to_metric,
    };
    if show_value && !entry.value.is_empty() {
        out.push('_');
        out.push_str(&entry.value);
    }
}

/// One level of a descriptor tree.
#[derive(Debug, Default)]
struct Level {
    /// In YAML (and, when merging, file) order.
    nodes: Vec<Node>,
    /// Composite key (`key` or `key_value`) -> index into `nodes`.
    index: FastMap<Box<str>, usize>,
    /// Indices of nodes whose composite key contains '*', in YAML order.
    wildcards: Vec<usize>,
}

#[derive(Debug)]
struct Node {
    /// Go's map key at this level: `key`, or `key_value` when the YAML gives a value.
    composite: Box<str>,
    /// The YAML `key` alone.
    key: Box<str>,
    limit: Option<Box<Limit>>,
    share_threshold: bool,
    value_to_metric: bool,
    children: Level,
}

impl Level {
    fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Levels of at most this many nodes are searched by comparing each node's composite key
    /// with the entry in place, which costs less than building the probe and hashing it
    /// (`benches/decision.rs`, `config_lookup`); larger ones use the index.
    const SCAN_AT_MOST: usize = 8;

    fn get(&self, composite: &str) -> Option<&Node> {
        self.index.get(composite).and_then(|&i| self.nodes.get(i))
    }

    /// The node whose composite key is the entry's `key_value`.
    fn exact(&self, probe: &mut Probe<'_, '_>) -> Option<&Node> {
        if self.nodes.len() <= Self::SCAN_AT_MOST {
            let entry = probe.entry;
            return self
                .nodes
                .iter()
                .find(|n| is_composite(&n.composite, entry));
        }
        self.get(probe.composite())
    }

    /// The node whose composite key is the entry's key alone.
    fn key_only(&self, key: &str) -> Option<&Node> {
        if self.nodes.len() <= Self::SCAN_AT_MOST {
            return self.nodes.iter().find(|n| *n.composite == *key);
        }
        self.get(key)
    }

    /// The first wildcard node, in YAML order, whose pattern matches the entry's `key_value`.
    fn match_wildcard(&self, probe: &mut Probe<'_, '_>) -> Option<&Node> {
        if self.wildcards.is_empty() {
            return None;
        }
        let composite = probe.composite();
        self.wildcards
            .iter()
            .filter_map(|&i| self.nodes.get(i))
            .find(|n| glob_match(&n.composite, composite))
    }

    /// Every limit below this level with the keys on its path (`path` holds the levels above).
    fn collect_paths<'a>(
        &'a self,
        path: &mut Vec<&'a str>,
        out: &mut Vec<(Vec<&'a str>, &'a Limit)>,
    ) {
        for n in &self.nodes {
            path.push(&n.key);
            if let Some(l) = &n.limit {
                out.push((path.clone(), l));
            }
            n.children.collect_paths(path, out);
            path.pop();
        }
    }

    fn collect_limits<'a>(&'a self, out: &mut Vec<&'a Limit>) {
        for n in &self.nodes {
            if let Some(l) = &n.limit {
                out.push(l);
            }
            n.children.collect_limits(out);
        }
    }

    /// Removes the nodes from `len` on (undoing a failed file's additions when merging).
    fn truncate(&mut self, len: usize) {
        for n in self.nodes.drain(len.min(self.nodes.len())..) {
            self.index.remove(&n.composite);
        }
        self.wildcards.retain(|&i| i < len);
    }
}

/// Go's map probe for an entry, `key_value`, written into the caller's buffer the first time a
/// level needs it as one string (its index or its wildcards), at most once per entry.
struct Probe<'e, 'b> {
    entry: &'e Entry,
    buf: &'b mut String,
    written: bool,
}

impl Probe<'_, '_> {
    fn composite(&mut self) -> &str {
        if !self.written {
            self.buf.clear();
            self.buf.push_str(&self.entry.key);
            self.buf.push('_');
            self.buf.push_str(&self.entry.value);
            self.written = true;
        }
        self.buf
    }
}

/// Whether `composite` is the entry's `key_value`, compared in place: the same answer as
/// building the [`Probe`] and comparing, so a key containing '_' matches
/// as it does in Go.
fn is_composite(composite: &str, entry: &Entry) -> bool {
    let (key, value) = (entry.key.as_str(), entry.value.as_str());
    composite.len() == key.len() + 1 + value.len()
        && composite.starts_with(key)
        && composite.as_bytes().get(key.len()) == Some(&b'_')
        && composite.ends_with(value)
}

/// `*` matches any run of characters (including none); everything else matches itself. A
/// pattern ending in its only `*` is therefore Go's prefix match.
fn glob_match(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let mut pieces: Vec<&str> = parts.collect();
    let Some(tail) = pieces.pop() else {
        // No '*' at all: an exact comparison.
        return rest.is_empty();
    };
    for piece in pieces {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.len() >= tail.len() && rest.ends_with(tail)
}

/// Builds a [`RateLimitConfig`] file by file, as Go's `loadConfig` does.
#[derive(Debug)]
pub(crate) struct Builder {
    domains: FastMap<String, Domain>,
    merge_domain_config: bool,
}

impl Builder {
    pub(crate) fn new(merge_domain_config: bool) -> Self {
        Builder {
            domains: FastMap::default(),
            merge_domain_config,
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
            let before = existing.root.nodes.len();
            let result = load_descriptors(&mut existing.root, &parent, root.descriptors);
            if result.is_err() {
                existing.root.truncate(before);
            }
            mark_stats_keys(&mut existing.root, PathStats::default());
            return result;
        }
        let mut level = Level::default();
        load_descriptors(&mut level, &parent, root.descriptors)?;
        mark_stats_keys(&mut level, PathStats::default());
        self.domains.insert(
            root.domain.clone(),
            Domain {
                name: root.domain,
                root: level,
            },
        );
        Ok(())
    }

    pub(crate) fn finish(self) -> RateLimitConfig {
        RateLimitConfig {
            domains: self.domains,
        }
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
) -> Result<(), String> {
    for d in descriptors {
        if d.key.is_empty() {
            return Err("descriptor has empty key".to_owned());
        }
        let composite = if d.value.is_empty() {
            d.key.clone()
        } else {
            format!("{}_{}", d.key, d.value)
        };
        let full_key = format!("{parent_key}{composite}");
        if level.index.contains_key(composite.as_str()) {
            return Err(format!("duplicate descriptor composite key '{full_key}'"));
        }

        let limit = match (d.rate_limit, d.rate_limits) {
            (None, None) => None,
            (Some(_), Some(_)) => {
                return Err("descriptor cannot have both rate_limit and rate_limits".to_owned());
            }
            (Some(rl), None) => Some(single_limit(rl)?),
            (None, Some(list)) => Some(multi_limit(list)?),
        };
        let is_wildcard = composite.contains('*');
        if d.share_threshold && !is_wildcard {
            return Err(format!(
                "share_threshold can only be used with wildcard values (containing '*'), but found key '{composite}'"
            ));
        }

        let metadata = match &d.metadata {
            None | Some(Yaml::Null) => None,
            Some(m) => {
                Some(metadata_to_json(m).map_err(|e| format!("error parsing metadata: {e}"))?)
            }
        };
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
            })
        });

        let mut children = Level::default();
        load_descriptors(&mut children, &format!("{full_key}."), d.descriptors)?;

        let i = level.nodes.len();
        let composite: Box<str> = composite.into();
        level.index.insert(composite.clone(), i);
        if is_wildcard {
            level.wildcards.push(i);
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
    Ok(())
}

/// A descriptor's limit before it is placed: its rule, name and `replaces`.
type LimitParts = (Rule, String, Vec<String>);

/// A `rate_limit:` block: Go's checks, in Go's order, then the Sluice extensions'.
fn single_limit(rl: RawRateLimit) -> Result<LimitParts, String> {
    let rule = if rl.unlimited {
        if Unit::from_name(&rl.unit).is_some() {
            return Err("should not specify rate limit unit when unlimited".to_owned());
        }
        if rl.algorithm.is_some()
            || rl.burst.is_some()
            || rl.charge_refused.is_some()
            || rl.unit_multiplier.is_some()
            || rl.safe_capacity.is_some()
        {
            return Err(
                "should not specify algorithm, burst, charge_refused, unit_multiplier or \
                 safe_capacity when unlimited"
                    .to_owned(),
            );
        }
        Rule::Unlimited
    } else {
        Rule::Limited(Box::new([block(&rl)?]))
    };
    check_replaces(&rl, &[rl.name.as_str()])?;
    let replaces = rl.replaces.into_iter().map(|r| r.name).collect();
    Ok((rule, rl.name, replaces))
}

/// A `rate_limits:` list: each element is checked as a `rate_limit` block, but may not be
/// unlimited (an unlimited element would make the others pointless).
fn multi_limit(list: Vec<RawRateLimit>) -> Result<LimitParts, String> {
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
        blocks.push(block(rl)?);
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
fn block(rl: &RawRateLimit) -> Result<Block, String> {
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
            requests_per_unit: rl.requests_per_unit,
            unit,
            unit_multiplier,
            algorithm,
            burst,
            charge_refused,
            safe_capacity: safe_capacity(rl)?,
        },
        name: rl.name.clone(),
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::raw;

    fn config(text: &str) -> RateLimitConfig {
        let mut b = Builder::new(false);
        b.add_file(raw::parse(text).expect("parses"))
            .expect("valid");
        b.finish()
    }

    fn build_err(text: &str) -> String {
        let mut b = Builder::new(false);
        match raw::parse(text) {
            Err(e) => e,
            Ok(root) => b.add_file(root).expect_err("should fail"),
        }
    }

    fn look<'a>(cfg: &'a RateLimitConfig, entries: &[(&str, &str)]) -> Option<Matched<'a>> {
        let entries: Vec<Entry> = entries.iter().map(|(k, v)| Entry::new(*k, *v)).collect();
        cfg.domain("d")?.lookup(&entries)
    }

    fn key_of(cfg: &RateLimitConfig, entries: &[(&str, &str)]) -> Option<String> {
        look(cfg, entries).map(|m| m.limit.full_key.clone())
    }

    const ORDER: &str = r#"
domain: d
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: foo*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: k
    value: f*
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: k
    value: foobar
    rate_limit: {unit: second, requests_per_unit: 4}
"#;

    #[test]
    fn exact_beats_wildcard_beats_key_only() {
        let cfg = config(ORDER);
        assert_eq!(
            key_of(&cfg, &[("k", "foobar")]).as_deref(),
            Some("d.k_foobar")
        );
        assert_eq!(
            key_of(&cfg, &[("k", "foobaz")]).as_deref(),
            Some("d.k_foo*")
        );
        assert_eq!(key_of(&cfg, &[("k", "fa")]).as_deref(), Some("d.k_f*"));
        assert_eq!(key_of(&cfg, &[("k", "x")]).as_deref(), Some("d.k"));
        assert_eq!(key_of(&cfg, &[("other", "x")]), None);
    }

    /// A level of more than `Level::SCAN_AT_MOST` nodes is searched through its index, a
    /// smaller one by comparing in place: both give the same matches, Go's quirks included.
    #[test]
    fn small_and_indexed_levels_match_alike() {
        const QUIRKS: &str = r#"
  - key: a_b
    value: c
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: e
    value: ""
    rate_limit: {unit: second, requests_per_unit: 7}
"#;
        let small = format!("{ORDER}{QUIRKS}");
        let padding: String = (0..Level::SCAN_AT_MOST)
            .map(|i| format!("  - key: pad{i}\n    value: v\n"))
            .collect();
        let indexed = format!("{small}{padding}");
        let (small, indexed) = (config(&small), config(&indexed));
        let top = |c: &RateLimitConfig| c.domain("d").map_or(0, |d| d.root.nodes.len());
        assert!(top(&small) <= Level::SCAN_AT_MOST);
        assert!(top(&indexed) > Level::SCAN_AT_MOST);
        for entry in [
            ("k", "foobar"),
            ("k", "foobaz"),
            ("k", "fa"),
            ("k", "x"),
            ("k", ""),
            ("other", "x"),
            // Go probes "a_b_c" for both, which is the composite key of `a_b: c`.
            ("a", "b_c"),
            ("a_b", "c"),
            ("a_b", "d"),
            ("e", ""),
            ("e", "x"),
            ("", ""),
        ] {
            let expected = key_of(&small, &[entry]);
            assert_eq!(key_of(&indexed, &[entry]), expected, "{entry:?}");
        }
        assert_eq!(
            key_of(&small, &[("k", "foobar")]).as_deref(),
            Some("d.k_foobar")
        );
        assert_eq!(key_of(&small, &[("a", "b_c")]).as_deref(), Some("d.a_b_c"));
        // An empty YAML value is a key-only node, which any value of the key matches.
        assert_eq!(key_of(&small, &[("e", "")]).as_deref(), Some("d.e"));
        assert_eq!(key_of(&small, &[("e", "x")]).as_deref(), Some("d.e"));
    }

    #[test]
    fn wildcards_are_tried_in_yaml_order() {
        // "foo*" comes first in the YAML, so it wins over "f*" for "foo1".
        let cfg = config(ORDER);
        assert_eq!(key_of(&cfg, &[("k", "foo1")]).as_deref(), Some("d.k_foo*"));
    }

    #[test]
    fn mid_pattern_wildcards_match() {
        let cfg = config(
            "domain: d\ndescriptors:\n  - key: m\n    value: bar*b\n    rate_limit: {unit: minute, requests_per_unit: 20}\n",
        );
        assert_eq!(
            key_of(&cfg, &[("m", "barxyzb")]).as_deref(),
            Some("d.m_bar*b")
        );
        assert_eq!(key_of(&cfg, &[("m", "barb")]).as_deref(), Some("d.m_bar*b"));
        assert_eq!(key_of(&cfg, &[("m", "barxyzc")]), None);
    }

    #[test]
    fn glob() {
        assert!(glob_match("a*", "a"));
        assert!(glob_match("a*", "abc"));
        assert!(!glob_match("a*", "ba"));
        assert!(glob_match("svc*ep*rpc", "svc1ep2rpc"));
        assert!(glob_match("svc*ep*rpc", "svceprpc"));
        assert!(!glob_match("svc*ep*rpc", "svc1ep2rp"));
        assert!(!glob_match("a*aa", "aa"));
        assert!(glob_match("*", ""));
        assert!(glob_match("abc", "abc"));
        assert!(!glob_match("abc", "abcd"));
    }

    const NESTED: &str = r#"
domain: d
descriptors:
  - key: a
    value: 1
    rate_limit: {unit: second, requests_per_unit: 1}
    descriptors:
      - key: b
        descriptors:
          - key: c
            value: 3
            rate_limit: {unit: hour, requests_per_unit: 3}
  - key: leaf
    rate_limit: {unit: day, requests_per_unit: 5}
"#;

    #[test]
    fn depth_rules() {
        let cfg = config(NESTED);
        // The limit of an intermediate node only applies when it is matched by the last entry.
        assert_eq!(key_of(&cfg, &[("a", "1")]).as_deref(), Some("d.a_1"));
        assert_eq!(key_of(&cfg, &[("a", "1"), ("b", "x")]), None);
        assert_eq!(
            key_of(&cfg, &[("a", "1"), ("b", "x"), ("c", "3")]).as_deref(),
            Some("d.a_1.b.c_3")
        );
        // More entries than config depth: no limit, even though "leaf" has one.
        assert_eq!(key_of(&cfg, &[("leaf", "x"), ("more", "y")]), None);
        // Unmatched middle entry stops matching.
        assert_eq!(key_of(&cfg, &[("a", "1"), ("zz", "x"), ("c", "3")]), None);
        assert_eq!(
            key_of(&cfg, &[("a", "1"), ("b", "x"), ("c", "3"), ("d", "4")]),
            None
        );
        assert!(look(&cfg, &[]).is_none());
    }

    #[test]
    fn empty_value_falls_back_to_key_only() {
        let cfg = config(NESTED);
        assert_eq!(key_of(&cfg, &[("leaf", "")]).as_deref(), Some("d.leaf"));
    }

    #[test]
    fn share_threshold_reports_patterns_with_star() {
        let cfg = config(
            r#"
domain: d
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: user
    value: u*
    share_threshold: true
    descriptors:
      - key: res
        value: r*
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: plain
    value: p*
    rate_limit: {unit: minute, requests_per_unit: 1}
"#,
        );
        let m = look(&cfg, &[("files", "files/a.pdf")]).expect("match");
        assert_eq!(m.shared_values, vec![(0, "files/*")]);
        assert_eq!(m.limit.full_key, "d.files_files/*");
        let m = look(&cfg, &[("user", "u1"), ("res", "r1")]).expect("match");
        assert_eq!(m.shared_values, vec![(0, "u*")]);
        let m = look(&cfg, &[("plain", "p1")]).expect("match");
        assert!(m.shared_values.is_empty());
        assert_eq!(m.shared_values.capacity(), 0);
    }

    #[test]
    fn unlimited_and_flags() {
        let cfg = config(
            r#"
domain: d
descriptors:
  - key: u
    rate_limit: {unlimited: true, name: free, replaces: [{name: paid}]}
  - key: s
    shadow_mode: true
    quota_mode: true
    detailed_metric: true
    value_to_metric: true
    rate_limit: {unit: Minute, requests_per_unit: 7}
    metadata: {tier: gold, n: 1}
"#,
        );
        let u = look(&cfg, &[("u", "x")]).expect("match").limit;
        assert_eq!(u.rule, Rule::Unlimited);
        assert_eq!(u.name, "free");
        assert_eq!(u.replaces, vec!["paid".to_owned()]);
        let s = look(&cfg, &[("s", "x")]).expect("match").limit;
        assert_eq!(
            s.rule,
            Rule::Limited(Box::new([Block {
                quota: Quota::fixed(7, Unit::Minute),
                name: String::new(),
            }]))
        );
        assert!(s.shadow_mode && s.quota_mode && s.detailed_metric && s.value_to_metric);
        assert_eq!(
            s.metadata,
            Some(serde_json::json!({"tier": "gold", "n": 1}))
        );
    }

    #[test]
    fn dump_is_sorted_and_formatted() {
        let cfg = config(
            r#"
domain: d
descriptors:
  - key: z
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: a
    rate_limit: {unlimited: true}
    descriptors:
      - key: b
        quota_mode: true
        rate_limit: {unit: week, requests_per_unit: 9}
"#,
        );
        assert_eq!(
            cfg.dump(),
            "d.a: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false\n\
             d.a.b: unit=WEEK requests_per_unit=9, shadow_mode: false, quota_mode: true\n\
             d.z: unit=SECOND requests_per_unit=5, shadow_mode: true, quota_mode: false\n"
        );
        assert_eq!(RateLimitConfig::empty().dump(), "");
    }

    #[test]
    fn validation_messages() {
        assert_eq!(
            build_err("domain: d\ndescriptors:\n  - key: k\n    share_threshold: true\n"),
            "share_threshold can only be used with wildcard values (containing '*'), but found key 'k'"
        );
        assert_eq!(
            build_err("domain: d\ndescriptors:\n  - key: k\n    metadata: [a]\n"),
            "error parsing metadata: metadata must be a map, found '[a]'"
        );
        assert_eq!(
            build_err("domain: d\ndescriptors:\n  - key: k\n    metadata: {1: a}\n"),
            "error parsing metadata: key is not of type string: 1"
        );
        assert_eq!(
            build_err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: unknown}\n"),
            "invalid rate limit unit 'unknown'"
        );
        assert_eq!(
            build_err(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, unlimited: true}\n"
            ),
            "should not specify rate limit unit when unlimited"
        );
        // Nested duplicates name the full path.
        assert_eq!(
            build_err(
                "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n      - key: b\n"
            ),
            "duplicate descriptor composite key 'd.a.b'"
        );
    }

    #[test]
    fn stats_keys_follow_detailed_metric_and_value_to_metric() {
        let cfg = config(
            r#"
domain: d
descriptors:
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: detailed
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        value_to_metric: true
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: svc
    value: s*
    value_to_metric: true
    descriptors:
      - key: ep
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: user
    value: u*
    share_threshold: true
    descriptors:
      - key: ep
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 60}
"#,
        );
        let d = cfg.domain("d").expect("domain");
        let key = |e: &[(&str, &str)]| {
            let e: Vec<Entry> = e.iter().map(|(k, v)| Entry::new(*k, *v)).collect();
            d.stats_key(&e)
        };
        assert_eq!(key(&[("plain", "x")]).as_deref(), Some("d.plain"));
        assert_eq!(key(&[("detailed", "x")]).as_deref(), Some("d.detailed_x"));
        // share_threshold keeps the pattern even with value_to_metric; key-only shows the value.
        assert_eq!(
            key(&[("route", "api/v1"), ("method", "GET")]).as_deref(),
            Some("d.route_api/*.method_GET")
        );
        assert_eq!(
            key(&[("svc", "s1"), ("ep", "e")]).as_deref(),
            Some("d.svc_s1.ep")
        );
        assert_eq!(
            key(&[("user", "u7"), ("ep", "e")]).as_deref(),
            Some("d.user_u*.ep_e")
        );
        assert_eq!(key(&[("nothing", "x")]), None);
    }

    #[test]
    fn a_stats_key_is_one_counter_when_it_names_every_value() {
        let cfg = config(
            r#"
domain: d
descriptors:
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: tenant
    value: acme
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: detailed
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: route
    value: api/*
    share_threshold: true
    descriptors:
      - key: method
        value_to_metric: true
        rate_limit: {unit: minute, requests_per_unit: 60}
      - key: verb
        value: GET
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: svc
    value: s*
    value_to_metric: true
    descriptors:
      - key: ep
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: path
    value: p*
    descriptors:
      - key: ep
        value: e
        rate_limit: {unit: minute, requests_per_unit: 60}
"#,
        );
        let one = |full_key: &str| {
            cfg.limits()
                .find(|l| l.full_key == full_key)
                .map(|l| l.stats_key_is_one_counter)
        };
        assert_eq!(
            one("d.plain"),
            Some(false),
            "key only: every value's counter"
        );
        assert_eq!(one("d.tenant_acme"), Some(true));
        assert_eq!(one("d.detailed"), Some(true), "the key shows the value");
        assert_eq!(
            one("d.route_api/*.method"),
            Some(true),
            "shared, then shown"
        );
        assert_eq!(one("d.route_api/*.verb_GET"), Some(true));
        assert_eq!(one("d.svc_s*.ep"), Some(false), "ep's value is left out");
        assert_eq!(one("d.path_p*.ep_e"), Some(false), "a wildcard's values");
    }

    #[test]
    fn the_slowest_block_has_the_lowest_sustained_rate() {
        let cfg = config(
            r#"
domain: d
descriptors:
  - key: a
    rate_limits:
      - {unit: second, requests_per_unit: 10}
      - {unit: minute, requests_per_unit: 100}
      - {unit: hour, requests_per_unit: 6000}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 5, unit_multiplier: 2}
  - key: c
    rate_limit: {unlimited: true}
"#,
        );
        let slowest = |full_key: &str| {
            let l = cfg.limits().find(|l| l.full_key == full_key)?;
            l.slowest_block()
                .map(|q| (q.requests_per_unit, q.unit, q.unit_multiplier))
        };
        // 10/s, 1.67/s and 1.67/s: the first of the two equals.
        assert_eq!(slowest("d.a"), Some((100, Unit::Minute, 1)));
        assert_eq!(slowest("d.b"), Some((5, Unit::Minute, 2)));
        assert_eq!(slowest("d.c"), None);
    }

    #[test]
    fn extension_checks_come_after_go_checks() {
        // Go's unit check wins over ours, so Go-valid messages stay first.
        assert_eq!(
            build_err(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, unlimited: true, algorithm: x}\n"
            ),
            "should not specify rate limit unit when unlimited"
        );
        assert_eq!(
            build_err(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: bogus, algorithm: x, burst: 0}\n"
            ),
            "invalid rate limit unit 'bogus'"
        );
        // A bad algorithm is reported before what it would make of the burst.
        assert_eq!(
            build_err(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, algorithm: nope, burst: 0}\n"
            ),
            "invalid rate limit algorithm 'nope'"
        );
        // burst 0 on a window is the window error: no burst at all belongs there.
        assert_eq!(
            build_err(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, burst: 0}\n"
            ),
            "burst can only be used with token_bucket or leaky_bucket, not 'fixed_window'"
        );
        // Elements are checked in order, each completely.
        assert_eq!(
            build_err(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, replaces: [{name: ''}]}\n      - {unlimited: true}\n"
            ),
            "should not have an empty replaces entry"
        );
        assert_eq!(
            build_err(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, name: a, replaces: [{name: a}]}\n"
            ),
            "replaces should not contain name of same descriptor"
        );
    }

    #[test]
    fn null_extension_keys_are_absent() {
        let cfg = config(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3, algorithm: null, burst: null}\n  - key: u\n    rate_limit: {unlimited: true, algorithm: null}\n    rate_limits: null\n",
        );
        assert_eq!(
            look(&cfg, &[("k", "x")]).expect("match").limit.rule,
            Rule::Limited(Box::new([Block {
                quota: Quota::fixed(3, Unit::Second),
                name: String::new(),
            }]))
        );
        assert_eq!(
            look(&cfg, &[("u", "x")]).expect("match").limit.rule,
            Rule::Unlimited
        );
    }

    #[test]
    fn names_lists_each_name_once() {
        let cfg = config(
            r#"
domain: d
descriptors:
  - key: single
    rate_limit: {unit: second, requests_per_unit: 1, name: one}
  - key: free
    rate_limit: {unlimited: true, name: free}
  - key: unnamed
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: multi
    rate_limits:
      - {unit: second, requests_per_unit: 1, name: a, replaces: [{name: x}, {name: y}]}
      - {unit: minute, requests_per_unit: 10}
      - {unit: hour, requests_per_unit: 100, name: b, replaces: [{name: y}, {name: z}]}
      - {unit: day, requests_per_unit: 1000, name: a}
"#,
        );
        let names = |k: &str| -> Vec<String> {
            let m = look(&cfg, &[(k, "v")]).expect("match");
            m.limit.names().map(str::to_owned).collect()
        };
        assert_eq!(names("single"), ["one"]);
        assert_eq!(names("free"), ["free"]);
        assert!(names("unnamed").is_empty());
        assert_eq!(names("multi"), ["a", "b"]);
        let multi = look(&cfg, &[("multi", "v")]).expect("match").limit;
        assert_eq!(multi.name, "");
        assert_eq!(multi.replaces, ["x", "y", "z"]);
    }

    #[test]
    fn failed_merge_is_rolled_back() {
        let mut b = Builder::new(true);
        b.add_file(raw::parse("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n").unwrap())
            .unwrap();
        let bad = raw::parse("domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: c\n    rate_limit: {unit: bogus}\n").unwrap();
        assert_eq!(
            b.add_file(bad).unwrap_err(),
            "invalid rate limit unit 'bogus'"
        );
        let cfg = b.finish();
        assert_eq!(cfg.limits().count(), 1);
        assert_eq!(key_of(&cfg, &[("b", "x")]), None);
    }
}
