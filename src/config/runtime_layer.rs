//! One domain's runtime limits as the lookup reads them: a tree of nodes kept in sharded hash
//! tables, each node found by its parent's id and its composite key (`key` or `key_value`, as
//! in the YAML's tree). A snapshot is immutable and cheap to copy: a change copies the shards it
//! touches (a few hundred nodes each at 100,000 limits) and shares the rest with the snapshot
//! being served, so 1,000 changes a second cost little and readers never wait.
//!
//! Here too the runtime limit itself ([`RuntimeLimit`]: path, body as given, compiled limit,
//! stamp) and the path's types, which the lookup reads; checking, composing and sharing them is
//! [`super::runtime`]'s.

use std::borrow::Cow;
use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::HashTable;

use super::limit::Limit;

/// A path's composite keys, owned where a level has a value.
pub(crate) struct Composites<'a>(Vec<Cow<'a, str>>);

impl<'a> Composites<'a> {
    pub(crate) fn of(levels: &[PathLevel<'a>]) -> Self {
        Composites(levels.iter().map(|(k, v)| composite(k, *v)).collect())
    }

    pub(crate) fn keys(&self) -> Vec<&str> {
        self.0.iter().map(AsRef::as_ref).collect()
    }
}

/// Shards per domain: at 100,000 limits a change copies about 400 nodes.
const SHARDS: usize = 256;

/// The id of the domain's root; nodes get ids from 1 on.
pub(crate) const ROOT: u64 = 0;

/// A node of the runtime tree: a level of one or more runtime limits' paths.
#[derive(Clone, Debug)]
pub(crate) struct RtNode {
    pub(crate) parent: u64,
    pub(crate) id: u64,
    /// `key`, or `key_value` when the level has a value: the YAML tree's composite key.
    pub(crate) composite: Arc<str>,
    /// Nodes below this one.
    pub(crate) children: u32,
    /// The limit set at this path, if any.
    pub(crate) limit: Option<Arc<RuntimeLimit>>,
}

/// One domain's runtime tree.
#[derive(Clone, Debug)]
pub(crate) struct RuntimeLayer {
    shards: Vec<Arc<HashTable<RtNode>>>,
    hasher: foldhash::fast::RandomState,
    limits: usize,
}

impl Default for RuntimeLayer {
    fn default() -> Self {
        RuntimeLayer {
            shards: (0..SHARDS).map(|_| Arc::new(HashTable::new())).collect(),
            hasher: foldhash::fast::RandomState::default(),
            limits: 0,
        }
    }
}

impl RuntimeLayer {
    fn hash(&self, parent: u64, composite: &str) -> u64 {
        self.hasher.hash_one((parent, composite))
    }

    /// The shard of a hash: bits the table itself does not use (it takes the low bits for the
    /// bucket and the top seven for its tags).
    fn shard_of(hash: u64) -> usize {
        (hash >> 32) as usize % SHARDS
    }

    /// The node below `parent` whose composite key is `composite`.
    pub(crate) fn child(&self, parent: u64, composite: &str) -> Option<&RtNode> {
        let hash = self.hash(parent, composite);
        self.shards
            .get(Self::shard_of(hash))?
            .find(hash, |n| n.parent == parent && *n.composite == *composite)
    }

    /// The limit set at the node of `levels`, if any (another path of the same composite keys
    /// names the same node).
    pub(crate) fn limit_at(&self, levels: &[PathLevel<'_>]) -> Option<&Arc<RuntimeLimit>> {
        self.limit_at_keys(&Composites::of(levels).keys())
    }

    fn limit_at_keys(&self, composites: &[&str]) -> Option<&Arc<RuntimeLimit>> {
        let mut parent = ROOT;
        let mut node = None;
        for composite in composites {
            let n = self.child(parent, composite)?;
            parent = n.id;
            node = Some(n);
        }
        node?.limit.as_ref()
    }

    /// How many limits the layer holds.
    pub(crate) fn len(&self) -> usize {
        self.limits
    }

    /// Every limit of the layer, in no particular order.
    pub(crate) fn limits(&self) -> impl Iterator<Item = &Arc<RuntimeLimit>> {
        self.shards
            .iter()
            .flat_map(|s| s.iter())
            .filter_map(|n| n.limit.as_ref())
    }

    /// The node below `parent` at `composite`, for a change: its shard is copied first if a
    /// snapshot shares it.
    fn child_mut(&mut self, parent: u64, composite: &str) -> Option<&mut RtNode> {
        let hash = self.hash(parent, composite);
        let shard = Arc::make_mut(self.shards.get_mut(Self::shard_of(hash))?);
        shard.find_mut(hash, |n| n.parent == parent && *n.composite == *composite)
    }

    fn insert_node(&mut self, node: RtNode) {
        let hash = self.hash(node.parent, &node.composite);
        let hasher = self.hasher;
        if let Some(shard) = self.shards.get_mut(Self::shard_of(hash)) {
            Arc::make_mut(shard)
                .insert_unique(hash, node, |n| hasher.hash_one((n.parent, &*n.composite)));
        }
    }

    fn remove_node(&mut self, parent: u64, composite: &str) {
        let hash = self.hash(parent, composite);
        if let Some(shard) = self.shards.get_mut(Self::shard_of(hash)) {
            let shard = Arc::make_mut(shard);
            if let Ok(entry) =
                shard.find_entry(hash, |n| n.parent == parent && *n.composite == *composite)
            {
                entry.remove();
            }
        }
    }

    /// Sets `limit` at the node of `levels`, creating the nodes it lacks with ids from
    /// `next_id`; the limit it replaced, if any.
    pub(crate) fn set(
        &mut self,
        levels: &[PathLevel<'_>],
        limit: Arc<RuntimeLimit>,
        next_id: &mut u64,
    ) -> Option<Arc<RuntimeLimit>> {
        self.set_keys(&Composites::of(levels).keys(), limit, next_id)
    }

    fn set_keys(
        &mut self,
        composites: &[&str],
        limit: Arc<RuntimeLimit>,
        next_id: &mut u64,
    ) -> Option<Arc<RuntimeLimit>> {
        let last = composites.len().checked_sub(1)?;
        let (mut grandparent, mut parent) = (ROOT, ROOT);
        for (i, composite) in composites.iter().enumerate() {
            let id = match self.child(parent, composite) {
                Some(n) => n.id,
                None => {
                    *next_id += 1;
                    self.insert_node(RtNode {
                        parent,
                        id: *next_id,
                        composite: (*composite).into(),
                        children: 0,
                        limit: None,
                    });
                    if let Some(above) = i.checked_sub(1) {
                        self.add_children(grandparent, composites[above], 1);
                    }
                    *next_id
                }
            };
            if i == last {
                let old = self.child_mut(parent, composite)?.limit.replace(limit);
                if old.is_none() {
                    self.limits += 1;
                }
                return old;
            }
            (grandparent, parent) = (parent, id);
        }
        None
    }

    /// Removes the limit at the node of `levels`, and the nodes left with no limit and nothing
    /// below them; the removed limit.
    pub(crate) fn remove(&mut self, levels: &[PathLevel<'_>]) -> Option<Arc<RuntimeLimit>> {
        self.remove_keys(&Composites::of(levels).keys())
    }

    fn remove_keys(&mut self, composites: &[&str]) -> Option<Arc<RuntimeLimit>> {
        // parents[i]: the id of the node above level i.
        let mut parents = Vec::with_capacity(composites.len());
        let mut parent = ROOT;
        for composite in composites {
            let node = self.child(parent, composite)?;
            parents.push(parent);
            parent = node.id;
        }
        let last = composites.len().checked_sub(1)?;
        let old = self
            .child_mut(parents[last], composites[last])?
            .limit
            .take()?;
        self.limits -= 1;
        for i in (0..=last).rev() {
            let unused = self
                .child(parents[i], composites[i])
                .is_some_and(|n| n.limit.is_none() && n.children == 0);
            if !unused {
                break;
            }
            self.remove_node(parents[i], composites[i]);
            if let Some(above) = i.checked_sub(1) {
                self.add_children(parents[above], composites[above], -1);
            }
        }
        Some(old)
    }

    /// Adds `by` to the count of nodes below the node at `composite` under `parent`.
    fn add_children(&mut self, parent: u64, composite: &str, by: i32) {
        if let Some(node) = self.child_mut(parent, composite) {
            node.children = node.children.saturating_add_signed(by);
        }
    }
}

/// One level of a runtime limit's path: a key, and its value unless the node is key-only.
pub(crate) type PathLevel<'a> = (&'a str, Option<&'a str>);

/// A runtime limit's path, owned: its levels' keys and values.
pub(crate) type OwnedPath = Box<[(Box<str>, Option<Box<str>>)]>;

/// One runtime limit as set: its path, the body as given (what `GET` answers), and the limit
/// the body compiles to.
#[derive(Debug)]
pub struct RuntimeLimit {
    pub levels: OwnedPath,
    pub body: serde_json::Value,
    pub limit: Limit,
    /// When it was set, and where: of two changes to one path, the later stamp wins.
    pub stamp: Stamp,
}

/// When and where a runtime limit was set or removed: microseconds since the epoch on the node
/// that made the change (never earlier than the change it replaced), and that node's address.
/// Stamps order by time, then address, so every node picks the same winner of two changes.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stamp {
    pub at_us: u64,
    pub origin: Arc<str>,
}

impl Stamp {
    /// A stamp for a change made now by `origin`, later than `after` (the stamp of what it
    /// replaces), so that a change always wins over what it changed whatever the clocks say.
    pub fn next(now_us: u64, origin: &Arc<str>, after: Option<&Stamp>) -> Stamp {
        Stamp {
            at_us: now_us.max(after.map_or(0, |a| a.at_us.saturating_add(1))),
            origin: Arc::clone(origin),
        }
    }
}

/// The composite key of a level, as the YAML tree keys its nodes: `key`, or `key_value`.
pub(crate) fn composite<'a>(key: &'a str, value: Option<&str>) -> std::borrow::Cow<'a, str> {
    match value {
        Some(v) => format!("{key}_{v}").into(),
        None => key.into(),
    }
}
