//! Free shares (issue 49, `docs/cluster.md`, "Free shares"): a fixed-window key far below its
//! limit is decided by each node from a share of the limit it may use without asking, so a key
//! touched a few times per window costs no call, no renewal and no lease anywhere.
//!
//! - **Permits** ([`Permits`], at the owner): with every Lease call a node that uses free shares
//!   asks its owner for a permit; the owner answers one ([`Permit`]): a share of every key's
//!   limit (`share_ppm`, the owner's SLUICE_LEASE_FREE_SHARE_PERCENT over the ring's size, so
//!   the shares of all nodes sum to at most that part of the limit), valid for a lease duration,
//!   and the time its run of permits began (`since_us`), the same while the node renews in time.
//! - **Use** ([`FreeShares`], at the node): in a window that began at least a lease duration
//!   after the run's start (and after this node started), while its permit holds, a node admits
//!   up to `floor(limit * share_ppm / 10^6)` hits of a key with no lease, counted locally. A hit
//!   past that *converts* the key: the node acquires a lease as for any key new to it, reporting
//!   what it admitted freely as used, and decides the key from its lease for the rest of the
//!   window.
//! - **The charge** ([`Permits::reserve`], at the owner): in every window, each node whose
//!   permits held at the window's start (for a window granted ahead: that hold now) and which has
//!   not reported about the key in it is charged its free share of the key; grants come out of
//!   what is left. A run that began after a window's start lets its node use nothing of that
//!   window, and a node that reported is charged what it reported instead, so what the nodes
//!   admit freely and what the owner grants never sum past the limit.
//! - **Recalls** ([`Permits::recall`], at the owner; [`FreeShares::recall`], at the node): a
//!   grant that charged other nodes their free share of a key (a lease holder wants the key)
//!   recalls it from them: each charged node learns it in the answer to its next call, stops
//!   deciding the key freely, and reports what it used (its next renewal round), in this window
//!   and in each window until the recall ends ([`recall_until`]), so the owner charges it what
//!   it used instead. A hot key's lease holders get the whole limit less what the others
//!   really used, a renewal interval or two after each window begins.
//! - **Owner changes**: a node that sees the ring change, or a new run of permits from an owner
//!   (the owner restarted, or the node's permit lapsed), converts every key it used freely in
//!   the current windows, so the new owner (or the restarted one, still rebuilding) learns
//!   what was used at the next renewal round.
//!
//! Buckets, sliding windows, `charge_refused` and concurrency limits keep their leases; a
//! cluster below a parent gives no permits (its capacity per window may be less than the limit).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use dashmap::DashMap;

use super::deadlines::Deadlines;
use super::window::{window_index, window_left_us};
use crate::limiter::{Algorithm, Decision, Quota};

/// Parts per million: a permit's share of each limit.
pub const PPM: u64 = 1_000_000;

/// The most nodes an owner keeps permit records for: far above any cluster, so only a peer
/// inventing names reaches it; past it a new name gets no permit (and so uses no free share).
const MAX_PERMITS: usize = 1024;

/// The most recalls an owner keeps waiting for one node, and sends it in one answer: past it a
/// recall waits for a later grant of its key (the node is charged its free share meanwhile).
const MAX_RECALLS: usize = 1024;

/// How long a recall lasts at least: ten lease durations, and two of the key's windows.
const RECALL_DURATIONS: u64 = 10;

/// When a recall made at `now_us` of a key under `quota` ends: the node reports about the key
/// in every window that begins before then.
pub(crate) fn recall_until(quota: &Quota, now_us: u64, duration_us: u64) -> u64 {
    let windows = 2 * quota.window().max_secs() * 1_000_000;
    now_us.saturating_add(windows.max(RECALL_DURATIONS * duration_us))
}

/// An owner's recall of a key from a node (the wire's `FreeRecall`): the node stops deciding
/// it freely and reports about it in every window until `until_us`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recall {
    pub key: Box<str>,
    pub quota: Quota,
    pub until_us: u64,
}

/// What a node may admit of each key of one owner with no call (the wire's `FreePermit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Permit {
    /// When the run of permits began, on the owner's clock (µs).
    pub since_us: u64,
    /// The permit holds this long after the node sent its call.
    pub valid_us: u64,
    /// The share of each key's limit, in parts per million.
    pub share_ppm: u64,
}

/// A node's free share of a limit of `limit` under a share of `share_ppm`.
pub(crate) fn free_share(limit: u64, share_ppm: u64) -> u64 {
    let share = u128::from(limit) * u128::from(share_ppm.min(PPM)) / u128::from(PPM);
    u64::try_from(share).unwrap_or(u64::MAX)
}

/// Whether a key under `quota` may be decided from free shares: a fixed window whose refused
/// hits are not charged.
pub(crate) fn eligible(quota: &Quota) -> bool {
    quota.algorithm == Algorithm::FixedWindow && !quota.charge_refused
}

/// One node's permits at an owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PermitRecord {
    pub node: Box<str>,
    /// When this owner first gave the node a permit (µs): windows that began before it were
    /// never free for the node.
    first_us: u64,
    /// The start of the node's current run, and when its permit ends (the latest it gave).
    since_us: u64,
    until_us: u64,
    /// The largest share this owner ever gave the node.
    share_ppm: u64,
}

impl PermitRecord {
    /// The share the node may have used of a window that began at `start_us` and that the
    /// owner grants at `now_us` (`ahead`: a window granted before it began): its largest share
    /// if a permit of it held at the window's start (ahead: holds now, and may be renewed into
    /// the window), else 0.
    fn share_in(&self, start_us: u64, now_us: u64, ahead: bool) -> u64 {
        let held = if ahead {
            self.until_us > now_us
        } else {
            self.until_us > start_us
        };
        if self.first_us <= start_us && held {
            self.share_ppm
        } else {
            0
        }
    }
}

/// The keys recalled from one node, each with its quota and the recall's end.
type Recalled = HashMap<Box<str>, (Quota, u64)>;

/// The permits an owner gave, one record per node.
#[derive(Debug)]
pub struct Permits {
    records: RwLock<Vec<PermitRecord>>,
    /// The recalls waiting for each node's next call: by node, then by key, its quota and end.
    recalls: Mutex<HashMap<Box<str>, Recalled>>,
    duration_us: u64,
}

impl Permits {
    pub fn new(duration_us: u64) -> Self {
        Permits {
            records: RwLock::new(Vec::new()),
            recalls: Mutex::new(HashMap::new()),
            duration_us,
        }
    }

    /// A permit for `node` at `now_us` with a share of `share_ppm`: the same run when its last
    /// permit still holds, else a new one. `None` past [`MAX_PERMITS`] nodes.
    pub fn give(&self, node: &str, now_us: u64, share_ppm: u64) -> Option<Permit> {
        let mut records = self.records.write().unwrap_or_else(PoisonError::into_inner);
        let i = match records.iter().position(|r| &*r.node == node) {
            Some(i) => i,
            None if records.len() >= MAX_PERMITS => return None,
            None => {
                records.push(PermitRecord {
                    node: node.into(),
                    first_us: now_us,
                    since_us: now_us,
                    until_us: 0,
                    share_ppm: 0,
                });
                records.len() - 1
            }
        };
        let r = &mut records[i];
        if r.until_us <= now_us {
            r.since_us = now_us;
        }
        r.until_us = now_us + self.duration_us;
        r.share_ppm = r.share_ppm.max(share_ppm);
        Some(Permit {
            since_us: r.since_us,
            valid_us: self.duration_us,
            share_ppm,
        })
    }

    /// Reads the records (a grant charges from them).
    pub fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<PermitRecord>> {
        self.records.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// What the nodes may have admitted freely of a window of `limit` that began at `start_us`,
    /// granted at `now_us` (`ahead`: before it began): each node's free share, but for `asker`,
    /// less what `covered` says the window already charges the node (`u64::MAX` once it
    /// reported about the key in the window: it decides the key from its lease; else the
    /// allowance it holds in the window, which it uses instead of its free share, not beside
    /// it). Each node charged something is handed to `charged`.
    pub fn reserve<'a>(
        records: &'a [PermitRecord],
        limit: u64,
        (start_us, now_us, ahead): (u64, u64, bool),
        asker: &str,
        covered: impl Fn(&str) -> u64,
        mut charged: impl FnMut(&'a str),
    ) -> u64 {
        records
            .iter()
            .filter(|r| &*r.node != asker)
            .map(|r| {
                let share = free_share(limit, r.share_in(start_us, now_us, ahead));
                (r, share.saturating_sub(covered(&r.node)))
            })
            .filter(|&(_, share)| share > 0)
            .map(|(r, share)| {
                charged(&r.node);
                share
            })
            .sum()
    }

    /// Recalls `key` (under `quota`) from `node` until `until_us`, at its next call: kept once
    /// per node and key (the later end), at most [`MAX_RECALLS`] per node.
    pub fn recall(&self, node: &str, key: &str, quota: Quota, until_us: u64) {
        let mut recalls = self.recalls.lock().unwrap_or_else(PoisonError::into_inner);
        let keys = match recalls.get_mut(node) {
            Some(keys) => keys,
            None => recalls.entry(node.into()).or_default(),
        };
        let full = keys.len() >= MAX_RECALLS;
        match keys.get_mut(key) {
            Some(r) => *r = (quota, r.1.max(until_us)),
            None if !full => {
                keys.insert(key.into(), (quota, until_us));
            }
            None => {}
        }
    }

    /// The recalls waiting for `node`, taken to go with the answer to its call.
    pub fn take_recalls(&self, node: &str) -> Vec<Recall> {
        let mut recalls = self.recalls.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(keys) = recalls.remove(node) else {
            return Vec::new();
        };
        keys.into_iter()
            .map(|(key, (quota, until_us))| Recall {
                key,
                quota,
                until_us,
            })
            .collect()
    }
}

/// A node's permit from one owner, on its own clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Terms {
    pub since_us: u64,
    /// The permit holds until then (the call's send time plus its validity).
    pub until_us: u64,
    pub share_ppm: u64,
}

/// What a node admitted freely of one key in one window.
#[derive(Clone, Copy, Debug)]
struct Free {
    quota: Quota,
    epoch: u64,
    count: u64,
    /// The key took a lease in this window: no more free hits in it.
    converted: bool,
}

/// What [`FreeShares::admit`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreeRoute {
    /// Admitted from the free share.
    Admitted(Decision),
    /// Past the free share, or not free here: take a lease, reporting `used` (the hits admitted
    /// freely in the window).
    Lease { used: u64 },
}

/// What a free-share entry costs beside its key: `bench/programs/src/bin/lease_memory.rs` measures
/// 191 to 204 bytes with the key (27 to 31 bytes; 40,000 and 300,000 keys), and fails when a
/// measurement passes the charge.
pub const FREE_CHARGE: usize = 192;

/// The keys this node admitted freely in their current window.
pub struct FreeShares {
    counts: DashMap<Arc<str>, Free, foldhash::fast::RandomState>,
    /// Each key until its window ends, when it is forgotten.
    ends: Deadlines<Arc<str>>,
    /// When this node started (µs): windows that began before are not free (what it admitted
    /// in them before a restart is gone).
    started_us: u64,
    duration_us: u64,
    bytes: AtomicUsize,
    max_bytes: usize,
    pub decisions: AtomicU64,
    pub conversions: AtomicU64,
}

impl FreeShares {
    pub fn new(started_us: u64, duration_us: u64, tick_us: u64, max_bytes: usize) -> Self {
        FreeShares {
            counts: DashMap::default(),
            ends: Deadlines::new(tick_us),
            started_us,
            duration_us,
            bytes: AtomicUsize::new(0),
            max_bytes,
            decisions: AtomicU64::new(0),
            conversions: AtomicU64::new(0),
        }
    }

    /// Decides `hits` on `key` (which this node holds no lease of) at `now_us` under `terms`,
    /// the permit of the key's owner (`None`: none holds).
    pub fn admit(
        &self,
        key: &str,
        quota: &Quota,
        now_us: u64,
        hits: u64,
        terms: Option<Terms>,
    ) -> FreeRoute {
        let epoch = window_index(quota, now_us);
        let share = self.share(quota, epoch, now_us, terms);
        let mut entry = match self.counts.get_mut(key) {
            Some(e) => e,
            None if share == 0 => return FreeRoute::Lease { used: 0 },
            None => match self.insert(key, quota, epoch) {
                Some(e) => e,
                None => return FreeRoute::Lease { used: 0 },
            },
        };
        let (was, same_quota) = (entry.epoch, entry.quota == *quota);
        if was != epoch || !same_quota {
            // Another window, or a limit changed by a reload: the owner charged the share of
            // the limit it knew, so no free hits.
            self.reset(&mut entry, quota, epoch, was == epoch || share == 0);
        }
        let free = entry.value_mut();
        if free.converted {
            return FreeRoute::Lease { used: 0 };
        }
        if free.count + hits > share {
            free.converted = true;
            self.conversions.fetch_add(1, Ordering::Relaxed);
            return FreeRoute::Lease { used: free.count };
        }
        let before = free.count;
        free.count += hits;
        self.decisions.fetch_add(1, Ordering::Relaxed);
        FreeRoute::Admitted(decision(quota, now_us, before, hits))
    }

    /// Stops deciding `key` (under `quota`) freely in its current window at `now_us`, its
    /// owner having recalled it: the hits it admitted freely in it, for the lease it takes to
    /// report; `None` when the table has no room to remember the key.
    pub fn recall(&self, key: &str, quota: &Quota, now_us: u64) -> Option<u64> {
        let epoch = window_index(quota, now_us);
        let mut entry = match self.counts.get_mut(key) {
            Some(e) => e,
            None => self.insert(key, quota, epoch)?,
        };
        let free = *entry.value();
        let used = if free.epoch == epoch && free.quota == *quota && !free.converted {
            self.conversions.fetch_add(1, Ordering::Relaxed);
            free.count
        } else {
            0
        };
        self.reset(&mut entry, quota, epoch, true);
        entry.count = used;
        Some(used)
    }

    /// A new entry for `key` in window `epoch` of `quota`, parked until the window ends;
    /// `None` when the table is full.
    fn insert(&self, key: &str, quota: &Quota, epoch: u64) -> Option<FreeEntry<'_>> {
        if self.bytes.load(Ordering::Relaxed) >= self.max_bytes {
            return None;
        }
        let key: Arc<str> = key.into();
        self.ends.park(window_end(quota, epoch), key.clone());
        self.bytes
            .fetch_add(FREE_CHARGE + key.len(), Ordering::Relaxed);
        Some(self.counts.entry(key).or_insert(Free {
            quota: *quota,
            epoch,
            count: 0,
            converted: false,
        }))
    }

    /// Starts `entry` over in window `epoch` of `quota` (parked again when it is another
    /// window), `converted` or not.
    fn reset(&self, entry: &mut FreeEntry<'_>, quota: &Quota, epoch: u64, converted: bool) {
        if entry.epoch != epoch {
            self.ends
                .park(window_end(quota, epoch), entry.key().clone());
        }
        *entry.value_mut() = Free {
            quota: *quota,
            epoch,
            count: 0,
            converted,
        };
    }

    /// The free share of `quota`'s window `epoch` at `now_us` under `terms`: 0 unless the
    /// limit may be decided freely, the permit holds, and the window began a lease duration
    /// after the permits' run and after this node started.
    fn share(&self, quota: &Quota, epoch: u64, now_us: u64, terms: Option<Terms>) -> u64 {
        let Some(t) = terms.filter(|t| now_us < t.until_us && eligible(quota)) else {
            return 0;
        };
        let start_us = quota.window().start_us(epoch);
        if t.since_us.saturating_add(self.duration_us) > start_us || self.started_us > start_us {
            return 0;
        }
        free_share(u64::from(quota.requests_per_unit), t.share_ppm)
    }

    /// Converts every key admitted freely in its current window at `now_us` (the ring changed,
    /// or an owner began a new run of permits): each is handed to `lease` with what it
    /// admitted, to be reported to its owner at the next renewal round.
    pub(crate) fn convert_all(&self, now_us: u64, mut lease: impl FnMut(&str, Quota, u64)) {
        for mut entry in self.counts.iter_mut() {
            let free = entry.value_mut();
            if free.converted || free.epoch != window_index(&free.quota, now_us) {
                continue;
            }
            free.converted = true;
            let (quota, count) = (free.quota, free.count);
            self.conversions.fetch_add(1, Ordering::Relaxed);
            // The map's guard is held: `lease` must not touch this table.
            lease(entry.key(), quota, count);
        }
    }

    /// Forgets the keys whose window ended by `now_us` (each is looked at once, when its window
    /// ends: the table is never walked).
    pub(crate) fn forget_ended(&self, now_us: u64) {
        for key in self.ends.due(now_us) {
            let gone = self.counts.remove_if(&key, |_, free| {
                window_end(&free.quota, free.epoch) <= now_us
            });
            if gone.is_some() {
                self.bytes
                    .fetch_sub(FREE_CHARGE + key.len(), Ordering::Relaxed);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.counts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }
}

/// An entry of [`FreeShares`], locked.
type FreeEntry<'a> = dashmap::mapref::one::RefMut<'a, Arc<str>, Free>;

/// When window `epoch` of `quota` ends (µs).
fn window_end(quota: &Quota, epoch: u64) -> u64 {
    quota.window().end_us(epoch)
}

/// The decision for `hits` admitted freely at `now_us` after `before` of this node's: what it
/// knows of the window is its own count.
fn decision(quota: &Quota, now_us: u64, before: u64, hits: u64) -> Decision {
    let after = before + hits;
    Decision {
        penalized: false,
        count_before: before,
        count_after: after,
        over: false,
        remaining: u32::try_from(u64::from(quota.requests_per_unit).saturating_sub(after))
            .unwrap_or(u32::MAX),
        reset_after_secs: window_left_us(quota, now_us).div_ceil(1_000_000),
        expired: 0,
    }
}

#[cfg(test)]
mod tests;
