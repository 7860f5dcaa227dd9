//! The compiled config and its request-time lookup.
//!
//! [`super::build`] validates raw descriptors with the Go service's checks, in its order, and
//! builds one tree per domain. Each tree level holds its nodes in YAML order plus a hash index keyed by
//! Go's composite key (`key` or `key_value`) and the list of wildcard nodes, so matching one
//! request entry is one hash probe, then (rarely) a scan of the wildcard patterns, then one more
//! probe.

pub use super::limit::{Block, Limit, Rule, Source};
use super::patterns::Patterns;
pub(super) use super::patterns::check_pattern;
use super::runtime_layer::{PathLevel, ROOT, RtNode, RuntimeLayer, RuntimeLimit};
use crate::descriptor::Entry;
use crate::limiter::Algorithm;
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

pub(super) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
type FastSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

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
    pub(super) domains: FastMap<String, Domain>,
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

    /// Every limit in force of every domain, runtime limits included (a YAML limit one takes
    /// the place of left out), in no particular order.
    pub fn limits(&self) -> impl Iterator<Item = &Limit> {
        self.domains.values().flat_map(Domain::limits)
    }

    /// How many limits are in force, all domains together.
    pub fn limit_count(&self) -> usize {
        self.domains.values().map(|d| d.limits().len()).sum()
    }

    /// The `/rlconfig` text: one line per limit, sorted by full key (Go prints map order; a
    /// sorted dump is stable to diff):
    /// `<fullkey>: unit=<UNIT> requests_per_unit=<n>, shadow_mode: <bool>, quota_mode: <bool>`.
    ///
    /// A limit with several blocks (`rate_limits`) has one line per block, in YAML order; a
    /// block that is not a plain fixed window adds `, algorithm: <name>` and, when set,
    /// `, burst: <n>` and `, charge_refused: true`; a runtime limit ends in `, source: runtime`.
    /// Fixed-window limits from the YAML print exactly what Go prints.
    pub fn dump(&self) -> String {
        let mut limits: Vec<&Limit> = self.limits().collect();
        limits.sort_by(|a, b| a.full_key.cmp(&b.full_key));
        let mut out = String::new();
        for l in limits {
            match &l.rule {
                Rule::Unlimited => {
                    dump_prefix(&mut out, l, "UNKNOWN", 0);
                    dump_source(&mut out, l);
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
                        if q.calendar.is_zoned() {
                            let _ = write!(out, ", time_zone: {}", q.calendar.name());
                        }
                        if let Some(day) = q.calendar.week_start() {
                            let _ = write!(out, ", week_start: {day}");
                        }
                        dump_source(&mut out, l);
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

/// The end of a `/rlconfig` line: its source when not the config, and the newline.
fn dump_source(out: &mut String, l: &Limit) {
    if l.source != Source::Config {
        let _ = write!(out, ", source: {}", l.source.name());
    }
    out.push('\n');
}

/// One domain's descriptor tree: the YAML's (or xDS's), shared by every config composed over
/// it, and the runtime limits' layer over it, if the domain has any.
#[derive(Debug)]
pub struct Domain {
    pub(super) name: String,
    pub(super) root: Arc<Level>,
    pub(super) runtime: Option<Arc<RuntimeLayer>>,
}

impl Domain {
    pub(super) fn new(name: String, root: Level) -> Self {
        Domain {
            name,
            root: Arc::new(root),
            runtime: None,
        }
    }

    /// A domain only runtime limits have.
    pub(super) fn runtime_only(name: &str) -> Self {
        Domain::new(name.to_owned(), Level::default())
    }

    /// The same YAML tree, without the runtime layer.
    pub(super) fn share_root(&self) -> Self {
        Domain {
            name: self.name.clone(),
            root: Arc::clone(&self.root),
            runtime: None,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The runtime limit set at exactly this path, if any.
    pub(crate) fn runtime_limit(&self, levels: &[PathLevel<'_>]) -> Option<&Arc<RuntimeLimit>> {
        // Exactly this path: another of the same composite keys (`k_a=b` for `k=a_b`) is not it.
        self.runtime
            .as_deref()?
            .limit_at(levels)
            .filter(|r| r.path() == levels)
    }

    /// The domain's runtime limits, in no particular order.
    pub fn runtime_limits(&self) -> impl Iterator<Item = &Arc<RuntimeLimit>> {
        self.runtime.iter().flat_map(|l| l.limits())
    }

    /// Every limit of the domain with the descriptor keys on its path, root first (runtime
    /// limits after the YAML's).
    ///
    /// A YAML limit a runtime limit takes the place of (the same path) is left out: these are
    /// the limits in force.
    pub(crate) fn key_paths(&self) -> Vec<(Vec<&str>, &Limit)> {
        let mut out = Vec::new();
        self.root.collect_paths(&mut Vec::new(), &mut out);
        self.in_force(
            out,
            |(_, l)| *l,
            |r| (r.levels.iter().map(|(k, _)| &**k).collect(), &r.limit),
        )
    }

    /// Every limit in force in the domain: [`Domain::key_paths`] without the paths (at 100,000
    /// limits, building those was most of the count the start-up log and the exporters take).
    pub fn limits(&self) -> Vec<&Limit> {
        let mut out = Vec::new();
        self.root.collect_limits(&mut out);
        self.in_force(out, |l| *l, |r| &r.limit)
    }

    /// `yaml`, the YAML's limits, without those a runtime limit takes the place of, then the
    /// runtime limits.
    fn in_force<'a, T>(
        &'a self,
        mut yaml: Vec<T>,
        limit: impl Fn(&T) -> &'a Limit,
        runtime: impl Fn(&'a RuntimeLimit) -> T,
    ) -> Vec<T> {
        if self.runtime.is_none() {
            return yaml;
        }
        // The YAML's full keys a runtime limit takes the place of, found through a set as
        // large as the YAML's limits, however many runtime limits there are.
        let keys: FastSet<&str> = yaml.iter().map(|t| limit(t).full_key.as_str()).collect();
        let replaced: FastSet<&str> = self
            .runtime_limits()
            .filter_map(|r| keys.get(r.limit.full_key.as_str()).copied())
            .collect();
        if !replaced.is_empty() {
            yaml.retain(|t| !replaced.contains(limit(t).full_key.as_str()));
        }
        yaml.extend(self.runtime_limits().map(|r| runtime(r)));
        yaml
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

    /// The matching walk, over the YAML's tree and the runtime layer together as if the
    /// runtime limits were written into the YAML at their paths: per level the exact node of
    /// either, else the YAML's first matching wildcard, else the key-only node of either; the
    /// runtime's limit where both have one. `metric`, when given, receives Go's
    /// `value_to_metric` key segments; `trace` each level's step.
    fn lookup_with<'a>(
        &'a self,
        entries: &[Entry],
        buf: &mut String,
        mut metric: Option<&mut String>,
        mut trace: Option<&mut Vec<Step<'a>>>,
    ) -> Option<Matched<'a>> {
        let mut level = Some(&*self.root);
        let layer = self.runtime.as_deref();
        // The runtime node matched at the level above (the root at first); `None` once the
        // runtime tree has nothing further down this path.
        let mut rt_parent = layer.map(|_| ROOT);
        let mut found: Option<&'a Limit> = None;
        let mut shared_values = Vec::new();
        let last = entries.len().checked_sub(1)?;
        for (i, entry) in entries.iter().enumerate() {
            let mut probe = Probe {
                entry,
                buf: &mut *buf,
                written: false,
            };
            let hop = Hop::find(level, layer.zip(rt_parent), &mut probe);
            if let Some(t) = trace.as_deref_mut() {
                t.push(Step {
                    entry: i,
                    matched: hop.step_match(),
                });
            }
            // Nothing at this level: the descriptor matches no limit.
            hop.composite()?;
            if let (How::Wildcard(pattern), Some(n)) = (hop.how, hop.node)
                && n.share_threshold
            {
                shared_values.push((i, pattern));
            }
            if let Some(m) = metric.as_deref_mut() {
                push_metric_segment(m, entry, hop.node, hop.how);
            }
            if i == last {
                found = hop.limit();
            }
            level = hop.node.map(|n| &n.children).filter(|c| !c.is_empty());
            rt_parent = hop.rt.filter(|n| n.children > 0).map(|n| n.id);
            if level.is_none() && rt_parent.is_none() {
                break;
            }
        }
        found.map(|limit| Matched {
            limit,
            shared_values,
        })
    }
}

/// What one level of the walk matched: the YAML's node, the runtime's, or both (the same
/// composite key), and how.
struct Hop<'a> {
    node: Option<&'a Node>,
    rt: Option<&'a RtNode>,
    how: How<'a>,
}

impl<'a> Hop<'a> {
    fn find(
        level: Option<&'a Level>,
        rt: Option<(&'a RuntimeLayer, u64)>,
        probe: &mut Probe<'_, '_>,
    ) -> Self {
        let node = level.and_then(|l| l.exact(probe));
        let rt_node = rt.and_then(|(layer, parent)| layer.child(parent, probe.composite()));
        if node.is_some() || rt_node.is_some() {
            return Hop {
                node,
                rt: rt_node,
                how: How::Exact,
            };
        }
        if let Some(w) = level.and_then(|l| l.match_wildcard(probe)) {
            let key = probe.entry.key.as_str();
            // Go trims "key_" off the pattern to get its value part; a `value_regex` node's
            // value part is `~` and its pattern (`key~pattern`).
            let pattern = w
                .composite
                .strip_prefix(key)
                .map(|rest| rest.strip_prefix('_').unwrap_or(rest))
                .unwrap_or(&w.composite);
            return Hop {
                node: Some(w),
                rt: None,
                how: How::Wildcard(pattern),
            };
        }
        let key = probe.entry.key.as_str();
        Hop {
            node: level.and_then(|l| l.key_only(key)),
            rt: rt.and_then(|(layer, parent)| layer.child(parent, key)),
            how: How::KeyOnly,
        }
    }

    /// The matched node's composite key; `None` when nothing matched.
    fn composite(&self) -> Option<&'a str> {
        match (self.node, self.rt) {
            (Some(n), _) => Some(&n.composite),
            (None, Some(r)) => Some(&r.composite),
            (None, None) => None,
        }
    }

    /// The node's limit: the runtime's where both have one.
    fn limit(&self) -> Option<&'a Limit> {
        self.rt
            .and_then(|r| r.limit.as_deref())
            .map(|r| &r.limit)
            .or_else(|| self.node.and_then(|n| n.limit.as_deref()))
    }

    fn step_match(&self) -> Option<StepMatch<'a>> {
        let share = self.node.is_some_and(|n| n.share_threshold);
        Some(StepMatch {
            node: self.composite()?,
            how: match self.how {
                How::Exact => "exact",
                How::Wildcard(_) if self.node.is_some_and(Node::is_pattern) => match share {
                    true => "value_regex, shared",
                    false => "value_regex",
                },
                How::Wildcard(_) if share => "wildcard, shared",
                How::Wildcard(_) => "wildcard",
                How::KeyOnly => "key only",
            },
            limit: self.limit(),
            has_children: self.node.is_some_and(|n| !n.children.is_empty())
                || self.rt.is_some_and(|r| r.children > 0),
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
    /// `exact` (the entry's `key_value`), `wildcard` (a `*` pattern) or `value_regex` (a
    /// pattern), first in YAML order, `… , shared` with `share_threshold` (one counter for every
    /// value), or `key only`.
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

/// One `.segment` of Go's `value_to_metric` stats key (`node`: the YAML's node, `None` for a
/// runtime node alone, which has neither `share_threshold` nor `value_to_metric`).
fn push_metric_segment(out: &mut String, entry: &Entry, node: Option<&Node>, how: How<'_>) {
    out.push('.');
    out.push_str(&entry.key);
    let share_threshold = node.is_some_and(|n| n.share_threshold);
    let value_to_metric = node.is_some_and(|n| n.value_to_metric);
    let show_value = match how {
        How::Exact => true,
        How::Wildcard(pattern) if share_threshold || !value_to_metric => {
            out.push('_');
            out.push_str(pattern);
            return;
        }
        How::Wildcard(_) => true,
        How::KeyOnly => value_to_metric,
    };
    if show_value && !entry.value.is_empty() {
        out.push('_');
        out.push_str(&entry.value);
    }
}

/// One level of a descriptor tree.
#[derive(Debug, Default)]
pub(super) struct Level {
    /// In YAML (and, when merging, file) order.
    pub(super) nodes: Vec<Node>,
    /// Composite key (`key` or `key_value`) -> index into `nodes`.
    pub(super) index: FastMap<Box<str>, usize>,
    /// The nodes whose composite key contains '*'.
    pub(super) wildcards: Wildcards,
}

/// A level's wildcard nodes: their indices in YAML order, and the same grouped by the literal
/// text before their first '*', so that a level of many patterns tries only those whose
/// prefix the entry starts with (one map probe per distinct prefix length) instead of every
/// pattern in turn (issue 40's scale envelope: 11 ms a miss at 100,000 patterns). Also the
/// level's `value_regex` nodes ([`Patterns`]), which rank with the wildcards in YAML order.
#[derive(Debug, Default)]
pub(super) struct Wildcards {
    order: Vec<usize>,
    by_prefix: FastMap<Box<str>, Vec<usize>>,
    /// The prefixes' distinct lengths, ascending.
    prefix_lens: Vec<usize>,
    /// `value_regex` nodes by their key.
    regexes: FastMap<Box<str>, Patterns>,
}

impl Wildcards {
    /// Node `i`, whose composite key is the pattern `composite`; nodes come in YAML order.
    pub(super) fn push(&mut self, i: usize, composite: &str) {
        self.order.push(i);
        let prefix = composite.split('*').next().unwrap_or("");
        if let Err(at) = self.prefix_lens.binary_search(&prefix.len()) {
            self.prefix_lens.insert(at, prefix.len());
        }
        self.by_prefix.entry(prefix.into()).or_default().push(i);
    }

    /// Node `i`, whose value must fully match `pattern` on `key` (`value_regex`, checked by
    /// [`check_pattern`]); nodes come in YAML order. Matched once [`Wildcards::compile`] ran.
    /// `Err` for a pattern the key already has.
    pub(super) fn push_regex(&mut self, i: usize, key: &str, pattern: &str) -> Result<(), String> {
        self.regexes
            .entry(key.into())
            .or_default()
            .push(i, key, pattern)
    }

    /// Compiles each key's patterns into one set, once a level's nodes are all in; `Err` when
    /// a key's patterns together pass [`super::patterns::MAX_PATTERNS_COMPILED_BYTES`].
    pub(super) fn compile(&mut self) -> Result<(), String> {
        for (key, p) in &mut self.regexes {
            if p.is_compiled() {
                continue;
            }
            p.compile().map_err(|e| {
                format!(
                    "the {} value_regex patterns of key '{key}' together: {e}",
                    p.sources.len()
                )
            })?;
        }
        Ok(())
    }

    /// Keeps the nodes before `len` (a failed file's additions undone).
    pub(super) fn truncate(&mut self, len: usize) {
        self.regexes.retain(|_, p| {
            let keep = p.nodes.iter().take_while(|&&i| i < len).count();
            if keep < p.nodes.len() {
                p.truncate(keep);
            }
            keep > 0
        });
        self.order.retain(|&i| i < len);
        self.by_prefix.retain(|_, ids| {
            ids.retain(|&i| i < len);
            !ids.is_empty()
        });
        let mut lens: Vec<usize> = self.by_prefix.keys().map(|p| p.len()).collect();
        lens.sort_unstable();
        lens.dedup();
        self.prefix_lens = lens;
    }

    pub(super) fn is_empty(&self) -> bool {
        self.order.is_empty() && self.regexes.is_empty()
    }

    /// The first `value_regex` node on `key`, in YAML order, whose pattern matches `value`.
    fn first_regex(&self, key: &str, value: &str) -> Option<usize> {
        self.regexes.get(key)?.first_match(value)
    }

    /// The first node in YAML order whose pattern matches `composite`.
    fn first_match(&self, nodes: &[Node], composite: &str) -> Option<usize> {
        let matches = |i: &usize| {
            nodes
                .get(*i)
                .is_some_and(|n| glob_match(&n.composite, composite))
        };
        if self.order.len() <= Level::SCAN_AT_MOST {
            return self.order.iter().copied().find(|i| matches(i));
        }
        self.prefix_lens
            .iter()
            .take_while(|&&l| l <= composite.len())
            .filter_map(|&l| composite.get(..l).and_then(|p| self.by_prefix.get(p)))
            .filter_map(|ids| ids.iter().copied().find(|i| matches(i)))
            .min()
    }
}

#[derive(Debug)]
pub(super) struct Node {
    /// Go's map key at this level: `key`, or `key_value` when the YAML gives a value.
    pub(super) composite: Box<str>,
    /// The YAML `key` alone.
    pub(super) key: Box<str>,
    pub(super) limit: Option<Box<Limit>>,
    pub(super) share_threshold: bool,
    pub(super) value_to_metric: bool,
    pub(super) children: Level,
}

impl Node {
    /// Whether the node matches by `value_regex` (its composite is `key~pattern`).
    fn is_pattern(&self) -> bool {
        self.composite.as_bytes().get(self.key.len()) == Some(&b'~')
    }
}

impl Level {
    fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Levels of at most this many nodes are searched by comparing each node's composite key
    /// with the entry in place, which costs less than building the probe and hashing it
    /// (`benches/decision.rs`, `config_lookup`); larger ones use the index.
    pub(super) const SCAN_AT_MOST: usize = 8;

    fn get(&self, composite: &str) -> Option<&Node> {
        self.index.get(composite).and_then(|&i| self.nodes.get(i))
    }

    /// The node whose composite key is `composite`.
    pub(super) fn node(&self, composite: &str) -> Option<&Node> {
        self.get(composite)
    }

    /// The composite key of the first wildcard node on `key`, if the level has one.
    pub(super) fn wildcard_of_key(&self, key: &str) -> Option<&str> {
        self.wildcards
            .order
            .iter()
            .filter_map(|&i| self.nodes.get(i))
            .find(|n| *n.key == *key)
            .map(|n| &*n.composite)
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
            // A `value_regex` node's composite (`key~pattern`) is no key-only node's.
            return self
                .nodes
                .iter()
                .find(|n| *n.composite == *key && *n.key == *key);
        }
        self.get(key)
    }

    /// The first wildcard or `value_regex` node, in YAML order, whose pattern matches the
    /// entry (a wildcard its `key_value`, a `value_regex` all of its value).
    fn match_wildcard(&self, probe: &mut Probe<'_, '_>) -> Option<&Node> {
        if self.wildcards.is_empty() {
            return None;
        }
        let (key, value) = (probe.entry.key.as_str(), probe.entry.value.as_str());
        let regex = self.wildcards.first_regex(key, value);
        let glob = match self.wildcards.order.is_empty() {
            true => None,
            false => self.wildcards.first_match(&self.nodes, probe.composite()),
        };
        let i = match (glob, regex) {
            (Some(g), Some(r)) => g.min(r),
            (g, r) => g.or(r)?,
        };
        self.nodes.get(i)
    }

    /// Every limit below this level with the keys on its path (`path` holds the levels above).
    fn collect_limits<'a>(&'a self, out: &mut Vec<&'a Limit>) {
        for n in &self.nodes {
            out.extend(n.limit.as_deref());
            n.children.collect_limits(out);
        }
    }

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

#[cfg(test)]
mod tests {
    use super::glob_match;

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
}
