//! The runtime limits' writer side: the YAML (or xDS) config last loaded, each domain's
//! runtime layer, and the served config composed of both. Every change and every reload
//! composes a new served config; the YAML's trees are shared, never copied.

use std::sync::Arc;

use super::RuntimeLayer;
use super::digest::{Digest, entry_hash};
use super::{PathLevel, Replicated, RuntimeLimit, Stamp, compile, composite, path_key, path_text};
use crate::config::lookup::{Domain, FastMap, Level, RateLimitConfig};
use crate::config::runtime_layer::Composites;

/// What a change did: made a new path or replaced the limit it had.
#[derive(Clone, Debug)]
pub enum Change {
    Created,
    Replaced { old: Arc<RuntimeLimit> },
}

/// Why a `PUT` was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PutError {
    /// The YAML's own message, or the runtime's rules'.
    #[error("{0}")]
    Invalid(String),
    #[error(
        "this node holds its maximum of {max} runtime limits (SLUICE_MAX_RUNTIME_LIMITS): remove some, or raise it"
    )]
    Full { max: usize },
}

/// The YAML config and the runtime layers over it.
#[derive(Debug)]
pub struct RuntimeState {
    base: Option<Arc<RateLimitConfig>>,
    layers: FastMap<String, Arc<RuntimeLayer>>,
    /// The last node id handed out (ids are never reused, so a snapshot's ids stay valid).
    next_id: u64,
    max: usize,
    /// Counts the changes made (puts and removals), for those who save or share them.
    sequence: u64,
    /// Removals remembered, by [`path_key`].
    tombstones: FastMap<String, Replicated>,
    /// The number of removals remembered after the last pruning.
    pruned_at: usize,
    /// The limits and remembered removals, counted and summed, kept as they change: what the
    /// anti-entropy pass compares with a peer's.
    digest: Digest,
    /// The changes not yet taken by the one who saves them ([`RuntimeState::take_changes`]):
    /// behind a lock of their own because the saver takes them through a shared reference
    /// (`ConfigHandle::runtime`), which composes no new served config, as a change would.
    unsaved: std::sync::Mutex<Unsaved>,
}

/// The most changes kept for [`RuntimeState::take_changes`] between two takes; past it they
/// are dropped, and the taker saves every limit instead.
pub(crate) const UNSAVED_MAX: usize = 4096;

/// The changes kept since the last take.
#[derive(Debug, Default)]
struct Unsaved {
    keeping: bool,
    overflowed: bool,
    changes: Vec<Kept>,
}

/// One change kept: a limit as set (shared with the layer), or a removal.
#[derive(Debug)]
enum Kept {
    Set(String, Arc<RuntimeLimit>),
    Removed(Replicated),
}

/// How long a removal is remembered: a node that comes back after missing a removal for
/// longer may bring the removed limit back (docs/runtime-limits.md).
pub(crate) const TOMBSTONE_LIFE_US: u64 = 24 * 3600 * 1_000_000;

/// What [`RuntimeState::apply`] did with a change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    Set,
    Removed,
    /// This node holds a later change for the path.
    Stale,
    /// The YAML's checks refuse it (a node of another version sent it).
    Refused(String),
}

impl Default for RuntimeState {
    fn default() -> Self {
        RuntimeState::new(None, super::DEFAULT_MAX_RUNTIME_LIMITS)
    }
}

impl RuntimeState {
    pub fn new(base: Option<RateLimitConfig>, max: usize) -> Self {
        RuntimeState {
            base: base.map(Arc::new),
            layers: FastMap::default(),
            next_id: 0,
            max,
            sequence: 0,
            tombstones: FastMap::default(),
            pruned_at: 0,
            digest: Digest::default(),
            unsaved: std::sync::Mutex::default(),
        }
    }

    /// Replaces the YAML config (a reload); the runtime layers stay.
    pub(crate) fn set_base(&mut self, base: RateLimitConfig) {
        self.base = Some(Arc::new(base));
    }

    /// The served config: the YAML's domains with their runtime layers, and the domains only
    /// runtime limits have. `None` when there is neither (no config loaded yet).
    pub(crate) fn compose(&self) -> Option<RateLimitConfig> {
        self.compose_with(None)
    }

    fn compose_with(&self, over: Option<(&str, &Arc<RuntimeLayer>)>) -> Option<RateLimitConfig> {
        let mut domains: FastMap<String, Domain> = FastMap::default();
        if let Some(base) = &self.base {
            for d in base.domains.values() {
                domains.insert(d.name.clone(), d.share_root());
            }
        }
        let layers = self
            .layers
            .iter()
            .filter(|(name, _)| over.is_none_or(|(o, _)| o != name.as_str()))
            .map(|(name, layer)| (name.as_str(), layer))
            .chain(over);
        for (name, layer) in layers {
            if layer.len() == 0 {
                continue;
            }
            domains
                .entry(name.to_owned())
                .or_insert_with(|| Domain::runtime_only(name))
                .runtime = Some(Arc::clone(layer));
        }
        if self.base.is_none() && domains.is_empty() {
            return None;
        }
        Some(RateLimitConfig { domains })
    }

    /// The number of changes made so far: the last change's number.
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// Whether there are no runtime limits.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// How many runtime limits there are, all domains together.
    pub fn len(&self) -> usize {
        self.layers.values().map(|l| l.len()).sum()
    }

    /// Every runtime limit, with its domain, in no particular order.
    pub fn all(&self) -> Vec<(String, Arc<RuntimeLimit>)> {
        self.layers
            .iter()
            .flat_map(|(d, l)| l.limits().map(move |r| (d.clone(), Arc::clone(r))))
            .collect()
    }

    /// Checks and sets the limit at `levels` of `domain` (the API's rules), made by `origin`
    /// at `now_us`.
    pub fn put(
        &mut self,
        domain: &str,
        levels: &[PathLevel<'_>],
        body: serde_json::Value,
        (now_us, origin): (u64, &Arc<str>),
    ) -> Result<(Change, Arc<RuntimeLimit>), PutError> {
        let stamp = Stamp::next(now_us, origin, self.stamp_at(domain, levels).as_ref());
        self.put_as(domain, levels, body, Rules::Api, stamp)
    }

    /// [`RuntimeState::put`] under `rules`, with the stamp given.
    pub(crate) fn put_as(
        &mut self,
        domain: &str,
        levels: &[PathLevel<'_>],
        body: serde_json::Value,
        rules: Rules,
        stamp: Stamp,
    ) -> Result<(Change, Arc<RuntimeLimit>), PutError> {
        let limit = self.checked(domain, levels, body, rules, stamp)?;
        // Out of the map while it changes, so that only the shards the served config shares
        // are copied (loading 100,000 limits in one change copies none).
        let mut layer = self.layers.remove(domain).unwrap_or_default();
        let old = Arc::make_mut(&mut layer).set(levels, Arc::clone(&limit), &mut self.next_id);
        self.layers.insert(domain.to_owned(), layer);
        if let Some(old) = &old {
            self.digest.remove(limit_hash(domain, old));
        }
        // (The key is written only when there are removals: a load of 100,000 has none.)
        if !self.tombstones.is_empty()
            && let Some(removal) = self.tombstones.remove(&path_key(domain, levels))
        {
            self.digest.remove(removal_hash(&removal));
        }
        self.digest.add(limit_hash(domain, &limit));
        self.sequence += 1;
        self.keep(|| Kept::Set(domain.to_owned(), Arc::clone(&limit)));
        Ok((change_of(old), limit))
    }

    /// What [`RuntimeState::put`] would do, and the served config after it, changing nothing.
    pub(crate) fn preview_put(
        &self,
        domain: &str,
        levels: &[PathLevel<'_>],
        body: serde_json::Value,
    ) -> Result<(Change, Arc<RuntimeLimit>, RateLimitConfig), PutError> {
        let limit = self.checked(domain, levels, body, Rules::Api, Stamp::default())?;
        let mut layer = self.layers.get(domain).cloned().unwrap_or_default();
        let mut next_id = self.next_id;
        let old = Arc::make_mut(&mut layer).set(levels, Arc::clone(&limit), &mut next_id);
        let config = self
            .compose_with(Some((domain, &layer)))
            .unwrap_or_default();
        Ok((change_of(old), limit, config))
    }

    /// Removes the limit at `levels` of `domain`, made by `origin` at `now_us`; the removed
    /// limit and the removal, as a change to share. The removal is remembered for a day, so
    /// that a node that missed it does not bring the limit back.
    pub fn remove(
        &mut self,
        domain: &str,
        levels: &[PathLevel<'_>],
        (now_us, origin): (u64, &Arc<str>),
    ) -> Option<(Arc<RuntimeLimit>, Replicated)> {
        self.held_at(domain, levels)?;
        let old = self.remove_limit(domain, levels)?;
        let stamp = Stamp::next(now_us, origin, Some(&old.stamp));
        let removal = Replicated {
            body: None,
            at_us: stamp.at_us,
            origin: stamp.origin.to_string(),
            ..Replicated::of(domain, &old)
        };
        self.bury(removal.clone());
        Some((old, removal))
    }

    fn remove_limit(
        &mut self,
        domain: &str,
        levels: &[PathLevel<'_>],
    ) -> Option<Arc<RuntimeLimit>> {
        let mut layer = self.layers.remove(domain)?;
        let old = Arc::make_mut(&mut layer).remove(levels);
        if layer.len() > 0 {
            self.layers.insert(domain.to_owned(), layer);
        }
        if let Some(old) = &old {
            self.digest.remove(limit_hash(domain, old));
        }
        old
    }

    /// Remembers a removal (a change, with or without a limit removed), and forgets those
    /// older than [`TOMBSTONE_LIFE_US`] before it.
    fn bury(&mut self, removal: Replicated) {
        self.sequence += 1;
        self.keep(|| Kept::Removed(removal.clone()));
        let horizon = removal.at_us.saturating_sub(TOMBSTONE_LIFE_US);
        self.digest.add(removal_hash(&removal));
        if let Some(replaced) = self.tombstones.insert(removal.key(), removal) {
            self.digest.remove(removal_hash(&replaced));
        }
        if self.tombstones.len() > self.pruned_at.saturating_mul(2).max(1024) {
            let digest = &mut self.digest;
            self.tombstones.retain(|_, r| {
                let keep = r.at_us >= horizon;
                if !keep {
                    digest.remove(removal_hash(r));
                }
                keep
            });
            self.pruned_at = self.tombstones.len();
        }
    }

    /// The limits and remembered removals, counted and summed ([`Digest`]): equal on two nodes
    /// that hold the same.
    pub fn digest(&self) -> Digest {
        self.digest
    }

    /// The stamp of the limit at the path, or of its removal.
    fn stamp_at(&self, domain: &str, levels: &[PathLevel<'_>]) -> Option<Stamp> {
        let set = self
            .layers
            .get(domain)
            .and_then(|l| l.limit_at(levels))
            .map(|l| l.stamp.clone());
        set.or_else(|| {
            if self.tombstones.is_empty() {
                return None;
            }
            let removal = self.tombstones.get(&path_key(domain, levels));
            removal.map(Replicated::stamp)
        })
    }

    /// Applies a change made on another node (a peer's push, Redis's log) unless this node
    /// holds a later one for the path: the later stamp wins everywhere, so nodes that see the
    /// same changes in any order hold the same limits.
    pub fn apply(&mut self, change: &Replicated) -> Applied {
        let levels = change.path();
        let stamp = change.stamp();
        if self
            .stamp_at(&change.domain, &levels)
            .is_some_and(|held| held >= stamp)
        {
            return Applied::Stale;
        }
        match &change.body {
            Some(body) => {
                match self.put_as(&change.domain, &levels, body.clone(), Rules::Load, stamp) {
                    Ok(_) => Applied::Set,
                    Err(e) => Applied::Refused(e.to_string()),
                }
            }
            None => {
                self.remove_limit(&change.domain, &levels);
                self.bury(change.clone());
                Applied::Removed
            }
        }
    }

    /// Starts keeping every change for [`RuntimeState::take_changes`] (the runtime limits
    /// file's journal).
    pub(crate) fn keep_changes(&self) {
        self.unsaved().keeping = true;
    }

    /// The changes made since the last take, in order; `None` when more than [`UNSAVED_MAX`]
    /// came (then the taker saves every limit and removal instead).
    pub(crate) fn take_changes(&self) -> Option<Vec<Replicated>> {
        let mut unsaved = self.unsaved();
        let changes = std::mem::take(&mut unsaved.changes);
        if std::mem::take(&mut unsaved.overflowed) {
            return None;
        }
        let changes = changes.into_iter().map(|kept| match kept {
            Kept::Set(domain, limit) => Replicated::of(&domain, &limit),
            Kept::Removed(removal) => removal,
        });
        Some(changes.collect())
    }

    fn unsaved(&self) -> std::sync::MutexGuard<'_, Unsaved> {
        self.unsaved
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn keep(&mut self, change: impl FnOnce() -> Kept) {
        let unsaved = self
            .unsaved
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !unsaved.keeping || unsaved.overflowed {
            return;
        }
        if unsaved.changes.len() == UNSAVED_MAX {
            unsaved.changes = Vec::new();
            unsaved.overflowed = true;
            return;
        }
        unsaved.changes.push(change());
    }

    /// The removals remembered, as changes.
    pub fn removals(&self) -> Vec<Replicated> {
        self.tombstones.values().cloned().collect()
    }

    /// Every limit and every remembered removal, as changes, sorted by [`Replicated::key`]:
    /// what a node that catches up takes.
    pub fn export(&self) -> Vec<(String, Replicated)> {
        let mut out: Vec<(String, Replicated)> = self
            .all()
            .iter()
            .map(|(d, l)| Replicated::of(d, l))
            .chain(self.tombstones.values().cloned())
            .map(|r| (r.key(), r))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// What [`RuntimeState::remove`] would remove, and the served config after it.
    pub(crate) fn preview_remove(
        &self,
        domain: &str,
        levels: &[PathLevel<'_>],
    ) -> Option<(Arc<RuntimeLimit>, RateLimitConfig)> {
        self.held_at(domain, levels)?;
        let mut layer = Arc::clone(self.layers.get(domain)?);
        let old = Arc::make_mut(&mut layer).remove(levels)?;
        let config = self
            .compose_with(Some((domain, &layer)))
            .unwrap_or_default();
        Some((old, config))
    }

    /// The limit set at exactly `levels`: not one at another path of the same composite keys.
    fn held_at(&self, domain: &str, levels: &[PathLevel<'_>]) -> Option<&Arc<RuntimeLimit>> {
        self.layers
            .get(domain)?
            .limit_at(levels)
            .filter(|r| r.path() == levels)
    }

    /// The limit compiled, after the YAML's checks, `rules` and the cap.
    fn checked(
        &self,
        domain: &str,
        levels: &[PathLevel<'_>],
        body: serde_json::Value,
        rules: Rules,
        stamp: Stamp,
    ) -> Result<Arc<RuntimeLimit>, PutError> {
        let limit = compile(domain, levels, body, stamp).map_err(PutError::Invalid)?;
        let base = self.base.as_ref().and_then(|b| b.domains.get(domain));
        if rules == Rules::Api
            && let Some(refusal) = base.and_then(|d| wildcard_beside_key_only(&d.root, levels))
        {
            return Err(PutError::Invalid(refusal));
        }
        let node = self.layers.get(domain).and_then(|l| l.limit_at(levels));
        // Two paths can name one node (`k=a_b` and `k_a=b` are both `k_a_b`, as in the YAML's
        // tree and Go's): the YAML refuses the second, and so does the API, rather than replace
        // the limit set at the other path.
        if rules == Rules::Api
            && let Some(other) = node.filter(|n| n.path() != levels)
        {
            return Err(PutError::Invalid(format!(
                "duplicate descriptor composite key '{domain}.{}' (the runtime limit at {} has it)",
                Composites::of(levels).keys().join("."),
                path_text(&other.path())
            )));
        }
        if node.is_none() && self.len() >= self.max {
            return Err(PutError::Full { max: self.max });
        }
        Ok(Arc::new(limit))
    }
}

/// Which rules a change is held to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rules {
    /// The API's: the YAML's checks, no `*` in a value, no key-only level beside a wildcard.
    Api,
    /// Loading saved or replicated limits: the same but the wildcard rule, which is about what
    /// the YAML held when the limit was set; a limit already set is never dropped for it.
    Load,
}

/// A limit's entry in the [`Digest`].
fn limit_hash(domain: &str, limit: &RuntimeLimit) -> u64 {
    let levels = limit.levels.iter().map(|(k, v)| (&**k, v.as_deref()));
    entry_hash(domain, levels, &limit.stamp, false)
}

/// A remembered removal's entry in the [`Digest`].
fn removal_hash(removal: &Replicated) -> u64 {
    let levels = removal
        .levels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_deref()));
    entry_hash(&removal.domain, levels, &removal.stamp(), true)
}

fn change_of(old: Option<Arc<RuntimeLimit>>) -> Change {
    match old {
        None => Change::Created,
        Some(old) => Change::Replaced { old },
    }
}

/// The rule that keeps a runtime limit from changing matching silently: a key-only level is
/// matched only by values no exact node and no wildcard of its level matches, so where the YAML
/// has a wildcard on the same key at that level, a key-only runtime level would apply to some
/// values and not others. Such a path is refused; the message names the wildcard.
fn wildcard_beside_key_only(root: &Level, levels: &[PathLevel<'_>]) -> Option<String> {
    let mut level = root;
    for (depth, (key, value)) in levels.iter().enumerate() {
        if value.is_none()
            && let Some(w) = level.wildcard_of_key(key)
        {
            let path: Vec<String> = levels[..=depth]
                .iter()
                .map(|(k, v)| composite(k, *v).into_owned())
                .collect();
            return Some(format!(
                "{}: a key-only runtime level where the YAML has the wildcard '{w}' on the same key would apply only to the values the wildcard does not match; set the limit per value instead",
                path.join(".")
            ));
        }
        level = &level.node(&composite(key, *value))?.children;
    }
    None
}
