//! The lease server: the owner of a key (its owner on the ring) hands out the key's capacity to
//! the nodes that ask for it, as leases, and keeps what it has handed out.
//!
//! - **Windows** (fixed and sliding): a lease is an *allowance*, the most hits the node may
//!   admit in one window, counted from the window's start. The server keeps every node's
//!   allowance for the current window (and for the next, once granted ahead) and never lets
//!   their sum pass the limit (for a sliding window: the limit less the previous window's
//!   weighted allowances at the moment of the grant, which only grows as the window goes on).
//!   So a window admits at most its limit, whatever the timing.
//! - **Buckets** (token and leaky): a lease is a *share* of the bucket (parts per million of its
//!   rate and of its capacity); the node runs a local bucket of that share
//!   ([`super::client`]). Shares never sum past one million.
//!
//! Allowances and shares only go up at the server and only down at the client: a node lowers
//! what it holds when it renews (`keep`, what it promises not to exceed), the server raises it
//! by a grant. The server therefore never counts on capacity a node may still be using.
//!
//! **Fair share.** A grant is the node's max-min fair part ([`crate::limiter::share`]) of what is left,
//! split over the needs of the nodes whose leases are live: each node's need is its reported
//! *attempted* demand (refused hits included, Ably's lesson: measuring admitted traffic makes
//! shares oscillate) over the renewal horizon, and to the window's end the part of it that was
//! steady across the last boundary; under contention the rest in shorter steps
//! (`docs/cluster.md`, "Bursts"). A node that stops renewing keeps its allowance
//! charged until the window ends (it may have used it) but no longer counts for the split;
//! a bucket share is freed when its lease expires, since the node stops using it then.
//!
//! **Capacity.** A window's capacity is the key's limit, unless the owner says less
//! ([`LeaseServer::answer_within`]): a cluster below a parent (issue 39's tree) hands out what
//! the parent granted it for the window, and for the next one when it grants ahead. The fair
//! share then divides that, and the quota stays the limit.
//!
//! **A limit changed by a reload** (`docs/cluster.md`, "A limit changed while nodes hold
//! leases"). Nodes reload one after another, so asks naming the old and the new limit
//! interleave. The key's records stay: what was granted and used in the window is still
//! charged, and each window is held to the smallest limit its asks named ([`window_limit`]),
//! so it admits at most the larger of the two limits, and at most the new one once every node
//! has it. A bucket's shares stay too: they are fractions of whichever rate a node runs. A
//! change of algorithm or window length is another counter ([`same_counter`]), with a record
//! of its own beside the old one's until nothing is held in that: a window then admits at most
//! the old limit and the new, as forward mode's owner counts them in two counters.
//!
//! **Rebuild.** A key this node starts serving within a lease duration of a ring change (its own
//! start, a peer lost or added) may still be held by nodes under leases from another owner. Until
//! the lease duration has passed, every node's allowance is capped at an equal share of the limit
//! over the live nodes (the divided mode's share), and the nodes' reports (`used`, `keep`) are
//! taken as what they hold: every live node renews every key it holds each renewal interval, so
//! the server learns what is held within one interval, and what it cannot learn is what the lost
//! owner admitted itself. A key this node already served is rebuilt the same way after a peer
//! it had marked down answers again ([`LeaseServer::peer_returned`]): an owner reached again
//! after a partition knows nothing of what the other side's stand-in granted meanwhile until
//! the holders report, and without the cap it granted itself the whole window at once (issue
//! 35: 500 of 300 in the window an owner's 10 s cut healed). A peer lost or added needs no such
//! rebuild of the keys this node kept serving: no one else granted them.

use super::window::{is_window, micros, rate_milli, same_counter, window_index, window_left_us};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;
use smallvec::SmallVec;

use super::deadlines::Deadlines;
use super::free::{PermitRecord, Permits};
use crate::clock::Timestamp;
use crate::limiter::granted::ahead_due;
use crate::limiter::share::max_min_fair_into;
use crate::limiter::{Algorithm, Quota};

/// Shares of a bucket are parts per million.
pub(crate) const PPM: u64 = 1_000_000;

/// What a node asks about one key: a renewal (`want` 0) or an acquire (hits it wants to admit
/// now and cannot from what it holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ask {
    pub quota: Quota,
    /// Windows: the window index `used` and `keep` are about. Buckets: 0.
    pub epoch: u64,
    /// Windows: hits this node admitted in that window. Buckets: unused.
    pub used: u64,
    /// What the node still holds and will not exceed: an allowance (windows) or a share in ppm
    /// (buckets). The server lowers its record to this, never raises from it.
    pub keep: u64,
    /// Hits to admit now, beyond what the node holds (an acquire).
    pub want: u64,
    /// Hits per second this node was asked for (admitted or not), in thousandths.
    pub demand_milli: u64,
    /// How far ahead the asker needs its grants to look, when that is more than the owner's own
    /// horizon (two of its renewal intervals): a child cluster's owner asking across regions
    /// covers its renewal interval and its round trip. 0: the owner's horizon.
    pub horizon_us: u64,
}

/// What the server grants for one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Grant {
    /// Windows: the window index `allowance` is for. Buckets: 0.
    pub epoch: u64,
    /// The node's allowance in that window, or its share in ppm.
    pub allowance: u64,
    /// The node's fair part as the owner computed it: what it should hold when every node
    /// holds its part. A node holding more (it asked first) gives the excess back at its next
    /// renewal, so the others get theirs. `None` from an owner that does not say.
    pub fair: Option<u64>,
    /// The allowance granted ahead for the next window, when it starts within the horizon.
    pub next_allowance: Option<u64>,
    /// The lease ends this long after the node sent its ask.
    pub valid_us: u64,
    /// What the other nodes hold or used in the window (windows), for the `remaining` a node
    /// answers with.
    pub others: u64,
    /// The key's live holders at the owner, the asker included (0 from an owner that does not
    /// say): a child cluster's owner divides its capacity by it for its safe capacity.
    pub holders: u32,
    /// False when this server does not lease the key (its table is full): the node forwards
    /// the key's hits instead.
    pub leased: bool,
}

/// What a key's owner may hand out of it per window, when that is less than its limit: a
/// cluster below a parent in a tree of lease servers hands out the parent's grant. The quota
/// stays the configured limit. `None` is the quota's limit, and so is anything above it. A
/// capacity below what the holders already hold takes nothing back: it grants nothing new
/// until they give some back at their renewals, which the fair parts ask them to. A bucket's
/// capacity is a share of the whole in parts per million (`current` only): the share the
/// parent granted the cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capacity {
    /// For the window containing the ask.
    pub current: Option<u64>,
    /// For the window after it, granted ahead in the last renewals of the current one.
    pub next: Option<u64>,
}

/// What one key's holders together hold, used and ask for ([`LeaseServer::summary`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// The window index at the time asked (0 for a bucket).
    pub epoch: u64,
    /// Windows: hits used in the window, with what expired holders held (they may have used it).
    pub used: u64,
    /// Everything held in the window, expired holders' included; a bucket's shares (ppm).
    pub held: u64,
    /// The live holders' attempted demand, summed (hits per second, thousandths).
    pub demand_milli: u64,
}

/// The lease server's timing: the renewal interval, the lease duration, and its table bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTiming {
    /// SLUICE_LEASE_RENEW_MS: how often nodes renew.
    pub renew: Duration,
    /// SLUICE_LEASE_DURATION_MS: how long a lease holds without renewal.
    pub duration: Duration,
    /// SLUICE_LEASE_MAX_BYTES: the memory each of a node's two lease tables (the leases it
    /// holds, the leases it grants as an owner) may take, charged per entry as its key (or
    /// holder's name) plus the measured overhead ([`KEY_CHARGE`], [`HOLDER_CHARGE`],
    /// `super::SLOT_CHARGE`).
    pub max_bytes: usize,
    /// SLUICE_LEASE_FREE_SHARE_PERCENT, in parts per million: the part of each fixed window's
    /// limit the nodes together may admit from free shares ([`super::free`]); 0: off.
    pub free_share_ppm: u64,
}

impl LeaseTiming {
    /// The settings' defaults: renew every 100 ms, leases of 1 s, 32 MiB per table, free
    /// shares of half of each limit.
    pub const DEFAULT: LeaseTiming = LeaseTiming {
        renew: Duration::from_millis(100),
        duration: Duration::from_secs(1),
        max_bytes: 32 << 20,
        free_share_ppm: 500_000,
    };

    /// How far ahead a grant looks: until the node's next renewal, with one interval of slack.
    pub fn horizon_us(&self) -> u64 {
        micros(self.renew) * 2
    }

    pub fn duration_us(&self) -> u64 {
        micros(self.duration)
    }
}

/// One node's lease on a key.
#[derive(Clone, Debug)]
struct Holder {
    node: Box<str>,
    /// Windows: the allowance in the window; buckets: the share in ppm.
    allowance: u64,
    /// Windows: hits the node reported admitted in the window.
    used: u64,
    demand_milli: u64,
    /// The part of the node's demand that lasted across the last boundary, which it is
    /// presumed to keep up until this window ends: the lower of its demand as the window
    /// before ended and its mean demand over that whole window (the smoothed demand of sparse
    /// traffic is spiky). 0 for a node new in the window.
    steady_milli: u64,
    /// Hits (in thousandths) the node was asked for in this window, refused ones included:
    /// its reported demand integrated over the time between its asks.
    asked_milli: u64,
    /// When the node's last ask came (µs).
    asked_at_us: u64,
    expires_us: u64,
    /// The node reported about the key in this window: it decides the key from its lease for
    /// the rest of it, so it is charged what it reported, not its free share ([`super::free`]).
    reported: bool,
}

/// The holders of one window's allowances.
#[derive(Clone, Debug, Default)]
struct Epoch {
    index: u64,
    holders: Vec<Holder>,
    /// What holders whose leases expired held in the window (they may have used it all).
    retired: u64,
}

impl Epoch {
    /// Window `index`, with the holders of `before` as claimants (nothing held or used yet),
    /// so the first node to ask in it cannot take the share the others' demand claims.
    fn following(before: &Epoch, index: u64, window_secs: u64) -> Epoch {
        Epoch {
            index,
            holders: before
                .holders
                .iter()
                .map(|h| Holder {
                    allowance: 0,
                    used: 0,
                    steady_milli: h.demand_milli.min(h.asked_milli / window_secs.max(1)),
                    asked_milli: 0,
                    reported: false,
                    ..h.clone()
                })
                .collect(),
            retired: 0,
        }
    }

    /// The holders whose leases are live at `now_us`.
    fn live(&self, now_us: u64) -> u32 {
        let live = self
            .holders
            .iter()
            .filter(|h| h.expires_us > now_us)
            .count();
        u32::try_from(live).unwrap_or(u32::MAX)
    }

    /// Everything held in the window, expired holders' included.
    fn allowances(&self) -> u64 {
        self.retired + self.holders.iter().map(|h| h.allowance).sum::<u64>()
    }

    /// The index of `node`'s holder, added when new; `None` when there is no `room` for more
    /// bytes, or the epoch already has [`MAX_HOLDERS`] live holders (only a misbehaving peer
    /// could make that many).
    fn holder(&mut self, node: &str, room: bool) -> Option<usize> {
        if let Some(i) = self.holders.iter().position(|h| &*h.node == node) {
            return Some(i);
        }
        if !room || self.holders.len() >= MAX_HOLDERS {
            return None;
        }
        self.holders.push(Holder {
            node: node.into(),
            allowance: 0,
            used: 0,
            demand_milli: 0,
            steady_milli: 0,
            asked_milli: 0,
            asked_at_us: 0,
            expires_us: 0,
            reported: false,
        });
        Some(self.holders.len() - 1)
    }

    /// Handles the holders whose leases expired by `now_us`. A window's expired holder may have
    /// used all it held, so its allowance stays charged; it stays a record (claiming nothing),
    /// so that if its node asks again in the window it finds its record and is not charged a
    /// second time, and the records are folded into `retired` only once the window has
    /// [`MAX_HOLDERS`] of them. A bucket share is free once its lease ends (the node stops using
    /// it then).
    fn retire(&mut self, now_us: u64, window: bool) {
        if window && self.holders.len() < MAX_HOLDERS {
            return;
        }
        let mut retired = 0;
        self.holders.retain(|h| {
            let live = h.expires_us > now_us;
            if !live && window {
                retired += h.allowance;
            }
            live
        });
        self.retired += retired;
    }
}

/// What a leased key costs its owner beside its key's bytes, and each holder beside its name's:
/// `bench/programs/src/bin/lease_memory.rs` measures at most 582 and 129 (keys of 27 to 31 bytes,
/// names of 16, 40,000 to 300,000 keys with 1, 3 and 10 holders; the key's place among the sweep's
/// deadlines included, issue 49), which these round up; the program fails when a measurement passes
/// its charge, and `bench/run.sh` runs it.
pub(crate) const KEY_CHARGE: usize = 640;
pub(crate) const HOLDER_CHARGE: usize = 128;

/// The most live holders one key's window (or bucket) has: far above any cluster's size, so
/// only a misbehaving peer inventing node names reaches it; past it new holders get nothing.
const MAX_HOLDERS: usize = 1024;

/// Everything the server keeps for one key.
#[derive(Debug)]
struct KeyLeases {
    /// The quota of the last ask: its counter ([`same_counter`]: the algorithm, and a window's
    /// length) is this record's; a bucket's rate sizes the needs. A window's limit is not
    /// read from it but from `limit` and `next_limit`.
    quota: Quota,
    /// Windows: what the current window may hold, the smallest limit its asks named
    /// ([`window_limit`]), and the same for the window granted ahead (`next`).
    limit: u32,
    next_limit: u32,
    /// Until when (µs) grants are capped at an equal share (see the module's "Rebuild").
    rebuild_until_us: u64,
    /// The ring change (µs) the rebuild followed: a later one starts another.
    rebuilt_for_us: u64,
    /// Windows: the current window and the next one, once granted ahead; the previous one's
    /// allowances for a sliding window. Buckets: `current` only, index 0.
    current: Epoch,
    next: Option<Epoch>,
    previous_allowances: u64,
    /// When the server's sweep looks at the key next (µs, rounded to its tick): an earlier
    /// parking of the key is stale.
    parked_us: u64,
}

/// What one grant is computed from, beside the key's state.
struct GrantContext<'a> {
    node: &'a str,
    now_us: u64,
    /// Live nodes, for the rebuild cap.
    live: u64,
    timing: &'a LeaseTiming,
    /// Whether the server may keep another record (a new holder).
    room: bool,
    capacity: Capacity,
    /// How far ahead grants look: the owner's horizon, or the asker's when longer (up to a
    /// lease duration).
    horizon_us: u64,
    /// The permits for free shares this owner gave, each node charged its free share of a
    /// window it may have used freely ([`Permits::reserve`]).
    permits: &'a [PermitRecord],
    /// The nodes the grant charged their free share of the key, to recall it from.
    charged: RefCell<SmallVec<[&'a str; 4]>>,
}

/// A lease server's table: one entry per key it leases.
pub struct LeaseServer {
    keys: DashMap<Arc<str>, Mutex<KeyLeases>, foldhash::fast::RandomState>,
    /// The record of a key's other counter, kept while a reload that changed the key's
    /// algorithm or window length goes over the nodes (asks of both counters interleave), until
    /// nothing is held in it: two counters a key at most, as forward mode's owner keeps two.
    /// Rare, so kept apart: `keys` holds the record of each key's counter asked last.
    others: DashMap<Box<str>, KeyLeases, foldhash::fast::RandomState>,
    timing: LeaseTiming,
    /// Asks answered (renewals and acquires), and asks refused a lease (the table full).
    pub grants: AtomicU64,
    pub refused: AtomicU64,
    /// When a peer marked down last answered again (µs): every key already served rebuilds
    /// after it (see the module's "Rebuild").
    returned_us: AtomicU64,
    /// Bytes charged for what is kept: each key ([`KEY_CHARGE`] plus its length) and each
    /// holder of it in each window kept ([`HOLDER_CHARGE`] plus its name's length). Bounded by
    /// `timing.max_bytes`: past it no key or holder is added (they get no lease).
    bytes: AtomicUsize,
    /// Each key of `keys`, until it may be swept ([`KeyLeases::kept_until`]): a sweep looks at
    /// the keys whose time came, not at every key.
    sweeps: Deadlines<Arc<str>>,
    /// The permits for free shares this owner gave ([`super::free`]).
    pub permits: Permits,
}

/// A key's entry, for the debug endpoint: each holder's allowance or share, use and demand.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct HolderView {
    pub node: String,
    pub epoch: u64,
    pub allowance: u64,
    pub used: u64,
    pub demand_milli: u64,
    pub expires_in_ms: u64,
}

impl LeaseServer {
    pub fn new(timing: LeaseTiming) -> Self {
        LeaseServer {
            keys: DashMap::default(),
            others: DashMap::default(),
            timing,
            grants: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            returned_us: AtomicU64::new(0),
            bytes: AtomicUsize::new(0),
            sweeps: Deadlines::new(timing.duration_us()),
            permits: Permits::new(timing.duration_us()),
        }
    }

    /// A peer marked down answered again at `at`: every key this server already serves rebuilds
    /// for a lease duration from then, since a stand-in may have granted it meanwhile.
    pub fn peer_returned(&self, at: Timestamp) {
        self.returned_us.fetch_max(at.micros(), Ordering::Relaxed);
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Answers `node`'s ask about `key` at `now`. `last_change` is when this node last saw the
    /// ring change, `live` how many peers it believes up.
    pub fn answer(
        &self,
        node: &str,
        key: &str,
        ask: &Ask,
        now: Timestamp,
        last_change: Timestamp,
        live: usize,
    ) -> Grant {
        let all = Capacity::default();
        self.answer_within(node, key, ask, all, now, last_change, live)
    }

    /// [`Self::answer`], handing out at most `capacity` of the key in each window (a tree's
    /// child cluster: what its parent granted it).
    #[expect(
        clippy::too_many_arguments,
        reason = "`answer`'s arguments and the capacity; bundling them would only rename them"
    )]
    pub fn answer_within(
        &self,
        node: &str,
        key: &str,
        ask: &Ask,
        capacity: Capacity,
        now: Timestamp,
        last_change: Timestamp,
        live: usize,
    ) -> Grant {
        let now_us = now.micros();
        let room = self.bytes.load(Ordering::Relaxed) < self.timing.max_bytes;
        let Some(entry) = self.entry(key, ask, now_us, last_change, room) else {
            return Grant::default();
        };
        let mut leases = entry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.grants.fetch_add(1, Ordering::Relaxed);
        let returned_us = self.returned_us.load(Ordering::Relaxed);
        if returned_us > leases.rebuilt_for_us {
            leases.rebuilt_for_us = returned_us;
            leases.rebuild_until_us = leases
                .rebuild_until_us
                .max(returned_us + self.timing.duration_us());
        }
        let permits = self.permits.read();
        let ctx = GrantContext {
            node,
            now_us,
            live: u64::try_from(live.max(1)).unwrap_or(u64::MAX),
            timing: &self.timing,
            room,
            capacity,
            horizon_us: ask
                .horizon_us
                .min(self.timing.duration_us())
                .max(self.timing.horizon_us()),
            permits: &permits,
            charged: RefCell::default(),
        };
        // A limit's safe capacity is the asker's business (a partitioned node, a child cluster
        // cut off from its parent), not part of the quota the owner keeps.
        let ask = &Ask {
            quota: Quota {
                safe_capacity: None,
                ..ask.quota
            },
            ..*ask
        };
        if !same_counter(&ask.quota, &leases.quota) {
            self.switch_counter(key, &mut leases, ask.quota, now_us, room);
        }
        let before = leases.holder_bytes();
        let grant = leases.answer(ask, &ctx);
        // A lease holder wants the key: the nodes charged their free share of it report what
        // they used instead, from their next call on.
        let charged = ctx.charged.take();
        if !charged.is_empty() {
            let until_us = super::free::recall_until(&ask.quota, now_us, self.timing.duration_us());
            for node in charged {
                self.permits.recall(node, key, ask.quota, until_us);
            }
        }
        let after = leases.holder_bytes();
        if after >= before {
            self.bytes.fetch_add(after - before, Ordering::Relaxed);
        } else {
            self.bytes.fetch_sub(before - after, Ordering::Relaxed);
        }
        grant
    }

    /// `key`'s record, made for `ask` at `now_us` when new (rebuilding for a lease duration
    /// after `last_change`, and parked for the sweep); `None` when it is new and there is no
    /// `room` for it (counted in `refused`).
    fn entry(
        &self,
        key: &str,
        ask: &Ask,
        now_us: u64,
        last_change: Timestamp,
        room: bool,
    ) -> Option<dashmap::mapref::one::Ref<'_, Arc<str>, Mutex<KeyLeases>>> {
        if let Some(e) = self.keys.get(key) {
            return Some(e);
        }
        if !room {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let rebuild_until_us = (last_change.micros() + self.timing.duration_us()).max(now_us);
        let fresh = KeyLeases::new(ask.quota, now_us, rebuild_until_us);
        let shared: Arc<str> = key.into();
        self.keys.entry(shared.clone()).or_insert_with(|| {
            let charge = KEY_CHARGE + key.len() + fresh.holder_bytes();
            self.bytes.fetch_add(charge, Ordering::Relaxed);
            let mut fresh = fresh;
            fresh.parked_us = self.sweeps.rounded(now_us);
            self.sweeps.park(now_us, shared);
            Mutex::new(fresh)
        });
        self.keys.get(key)
    }

    /// Makes `quota`'s counter the record of `key` answered (`leases`): the record `others`
    /// keeps of it, else a new one. The record answered until now goes to `others` in its
    /// place (a third counter's record there is dropped, and so is this one when the table has
    /// no room: such a counter starts again if asked again).
    fn switch_counter(
        &self,
        key: &str,
        leases: &mut KeyLeases,
        quota: Quota,
        now_us: u64,
        room: bool,
    ) {
        let charge = |l: &KeyLeases| KEY_CHARGE + key.len() + l.holder_bytes();
        let kept = self.others.remove(key).and_then(|(_, other)| {
            self.bytes.fetch_sub(charge(&other), Ordering::Relaxed);
            same_counter(&other.quota, &quota).then_some(other)
        });
        let mut answered =
            kept.unwrap_or_else(|| KeyLeases::new(quota, now_us, leases.rebuild_until_us));
        // A rebuild is the key's, whichever counter it follows.
        answered.rebuild_until_us = answered.rebuild_until_us.max(leases.rebuild_until_us);
        answered.rebuilt_for_us = answered.rebuilt_for_us.max(leases.rebuilt_for_us);
        // So is its place among the sweep's deadlines.
        answered.parked_us = leases.parked_us;
        let previous = std::mem::replace(leases, answered);
        // `leases` is charged its key already: only its holders change.
        self.bytes
            .fetch_add(leases.holder_bytes(), Ordering::Relaxed);
        self.bytes
            .fetch_sub(previous.holder_bytes(), Ordering::Relaxed);
        if room {
            self.bytes.fetch_add(charge(&previous), Ordering::Relaxed);
            self.others.insert(key.into(), previous);
        }
    }

    /// Bytes charged for what this server keeps, for `/metrics`.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Drops the keys nobody can hold anything of any more: every lease expired, and for the
    /// windows the window (and for a sliding window the next one, which still weighs it) over;
    /// and so the records of keys' other counters. Looks only at the keys whose time to be
    /// swept came; those still in use wait for their next time.
    pub fn sweep(&self, now: Timestamp) {
        let now_us = now.micros();
        for key in self.sweeps.due(now_us) {
            let mut later = None;
            let gone = self.keys.remove_if(&key, |_, leases| {
                let mut l = leases
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if l.parked_us > now_us {
                    // Parked again since (the key was swept and asked for again).
                    return false;
                }
                let keep = l.in_use(now_us);
                if keep {
                    let at = self.sweeps.rounded(l.kept_until().max(now_us + 1));
                    l.parked_us = at;
                    later = Some(at);
                }
                !keep
            });
            if let Some((key, leases)) = gone {
                let l = leases
                    .into_inner()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let charge = KEY_CHARGE + key.len() + l.holder_bytes();
                self.bytes.fetch_sub(charge, Ordering::Relaxed);
            } else if let Some(at) = later {
                self.sweeps.park(at, key);
            }
        }
        self.others.retain(|key, l| {
            let keep = l.in_use(now_us);
            if !keep {
                let charge = KEY_CHARGE + key.len() + l.holder_bytes();
                self.bytes.fetch_sub(charge, Ordering::Relaxed);
            }
            keep
        });
    }

    /// What `key`'s holders together hold, used and ask for at `now`: what a child cluster's
    /// owner reports to its parent. `None` when this server does not lease the key.
    pub fn summary(&self, key: &str, now: Timestamp) -> Option<Summary> {
        let entry = self.keys.get(key)?;
        let l = entry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Some(l.summary(now.micros()))
    }

    /// The holders of `key`, for the debug endpoint.
    pub fn holders(&self, key: &str, now: Timestamp) -> Vec<HolderView> {
        let Some(entry) = self.keys.get(key) else {
            return Vec::new();
        };
        let l = entry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        std::iter::once(&l.current)
            .chain(&l.next)
            .flat_map(|e| {
                e.holders.iter().map(move |h| HolderView {
                    node: h.node.to_string(),
                    epoch: e.index,
                    allowance: h.allowance,
                    used: h.used,
                    demand_milli: h.demand_milli,
                    expires_in_ms: h.expires_us.saturating_sub(now.micros()) / 1000,
                })
            })
            .collect()
    }
}

/// The limit a window is held to once an ask naming `asked` comes, `held` being the limit it
/// was held to: the smallest its asks named. While a reload goes over the nodes, asks with the
/// old and the new limit interleave; the smaller keeps every window within the larger of the
/// two (what was granted under the larger stays granted), and within the new limit once every
/// node asks with it. A raised limit is used from the first window whose asks all name it.
pub(super) fn window_limit(held: u32, asked: u32) -> u32 {
    held.min(asked)
}

/// The bucket share (ppm) a demand of `demand_milli` needs, headroom included: what the owner
/// claims for a holder and what the holder keeps at a renewal, one rule for both.
pub(super) fn share_need(demand_milli: u64, quota: &Quota) -> u64 {
    need_of(
        demand_milli,
        0,
        Need::Share {
            rate_milli: rate_milli(quota),
        },
    )
}

impl KeyLeases {
    fn new(quota: Quota, now_us: u64, rebuild_until_us: u64) -> Self {
        let index = if is_window(&quota) {
            window_index(&quota, now_us)
        } else {
            0
        };
        KeyLeases {
            quota,
            limit: quota.requests_per_unit,
            next_limit: quota.requests_per_unit,
            rebuild_until_us,
            rebuilt_for_us: 0,
            current: Epoch {
                index,
                ..Epoch::default()
            },
            next: None,
            previous_allowances: 0,
            parked_us: 0,
        }
    }

    /// The bytes charged for this key's holders, in the windows it keeps.
    fn holder_bytes(&self) -> usize {
        std::iter::once(&self.current)
            .chain(&self.next)
            .flat_map(|e| &e.holders)
            .map(|h| HOLDER_CHARGE + h.node.len())
            .sum()
    }

    fn summary(&self, now_us: u64) -> Summary {
        let demand_milli = self
            .current
            .holders
            .iter()
            .filter(|h| h.expires_us > now_us)
            .map(|h| h.demand_milli)
            .sum();
        if !is_window(&self.quota) {
            return Summary {
                held: self.current.allowances(),
                demand_milli,
                ..Summary::default()
            };
        }
        let index = window_index(&self.quota, now_us);
        let window = |e: &Epoch| {
            let expired: u64 = e
                .holders
                .iter()
                .filter(|h| h.expires_us <= now_us)
                .map(|h| h.allowance.saturating_sub(h.used))
                .sum();
            let used: u64 = e.holders.iter().map(|h| h.used).sum();
            (e.retired + expired + used, e.allowances())
        };
        let (used, held) = if self.current.index == index {
            window(&self.current)
        } else {
            // The window moved on with no ask since: what was granted ahead is what is held.
            let ahead = self.next.as_ref().filter(|n| n.index == index);
            ahead.map_or((0, 0), window)
        };
        Summary {
            epoch: index,
            used,
            held,
            demand_milli,
        }
    }

    /// Until when [`KeyLeases::in_use`] may hold, with no ask: the last lease's end, and for
    /// the windows the end of the last window kept (a sliding window's, of the window after).
    fn kept_until(&self) -> u64 {
        let expires = std::iter::once(&self.current)
            .chain(&self.next)
            .flat_map(|e| &e.holders)
            .map(|h| h.expires_us)
            .max()
            .unwrap_or(0);
        if !is_window(&self.quota) {
            return expires;
        }
        let weighs = u64::from(self.quota.algorithm == Algorithm::SlidingWindow);
        let last = self
            .next
            .as_ref()
            .map_or(self.current.index, |n| n.index.max(self.current.index));
        expires.max(self.quota.window().end_us(last + weighs))
    }

    fn in_use(&self, now_us: u64) -> bool {
        let live = |e: &Epoch| e.holders.iter().any(|h| h.expires_us > now_us);
        if !is_window(&self.quota) {
            return live(&self.current);
        }
        let index = window_index(&self.quota, now_us);
        let weighs = self.quota.algorithm == Algorithm::SlidingWindow;
        // A window granted ahead is in use until it ends (a sliding one, until the window
        // after it ends): a key whose last asks granted ahead was never swept before.
        let ahead = |e: &Epoch| e.index + u64::from(weighs) >= index;
        live(&self.current)
            || self.next.as_ref().is_some_and(ahead)
            || self.current.index == index
            || (weighs && self.current.index + 1 == index)
    }

    /// Answers `ask`, about this record's counter ([`same_counter`]) under any limit.
    fn answer(&mut self, ask: &Ask, ctx: &GrantContext<'_>) -> Grant {
        // A reload may change a key's limit on one node after another: the records stay.
        self.quota = ask.quota;
        if is_window(&self.quota) {
            self.answer_window(ask, ctx)
        } else {
            self.answer_bucket(ask, ctx)
        }
    }

    /// Moves to the window containing `now_us`, for an ask naming the limit `asked`: the next
    /// window's grants (and limit) become current.
    fn roll(&mut self, now_us: u64, asked: u32) {
        let index = window_index(&self.quota, now_us);
        // Window by window while something was granted ahead (the window granted ahead may be
        // the one before `index`, whose allowances a sliding window must weigh); past that,
        // nothing is held in the windows between, so jump.
        while self.current.index < index {
            let ended = std::mem::take(&mut self.current);
            let following = ended.index + 1;
            self.previous_allowances = ended.allowances();
            self.current = match self.next.take() {
                Some(next) if next.index == following => {
                    self.limit = self.next_limit;
                    next
                }
                _ => {
                    self.limit = asked;
                    Epoch::following(&ended, following, self.quota.window().secs())
                }
            };
            if self.current.index < index && self.current.allowances() == 0 {
                self.previous_allowances = 0;
                self.current.index = index;
            }
        }
    }

    /// What may be held in a window held to `limit` given the owner's `capacity` for it: the
    /// limit, or less.
    fn limit_within(limit: u32, capacity: Option<u64>) -> u64 {
        let limit = u64::from(limit);
        capacity.map_or(limit, |c| c.min(limit))
    }

    /// The capacity of the current window at `now_us`: `limit`, less (sliding window) the
    /// previous window's allowances weighted by the part of it the sliding window still covers.
    fn window_capacity(&self, now_us: u64, limit: u64) -> u64 {
        if self.quota.algorithm != Algorithm::SlidingWindow {
            return limit;
        }
        let window = self.quota.window();
        let index = window.index_us(now_us);
        let unit_us = u128::from(window.end_us(index) - window.start_us(index)).max(1);
        let left = u128::from(window_left_us(&self.quota, now_us));
        let weighted = (u128::from(self.previous_allowances) * left).div_ceil(unit_us);
        limit.saturating_sub(u64::try_from(weighted).unwrap_or(u64::MAX))
    }

    fn answer_window(&mut self, ask: &Ask, ctx: &GrantContext<'_>) -> Grant {
        let asked = ask.quota.requests_per_unit;
        self.roll(ctx.now_us, asked);
        self.limit = window_limit(self.limit, asked);
        let index = self.current.index;
        let horizon = ctx.horizon_us;
        let left_us = window_left_us(&self.quota, ctx.now_us);
        let limit = Self::limit_within(self.limit, ctx.capacity.current);
        // A sliding window's grants ahead count against what is left of this one: at the next
        // window's start the estimate is this window's count plus the next one's.
        let ahead = match (&self.next, self.quota.algorithm) {
            (Some(next), Algorithm::SlidingWindow) => next.allowances(),
            _ => 0,
        };
        let window = self.quota.window();
        let free = self.free_reserve(&self.current, ask, ctx, window.start_us(index), false);
        let capacity = self
            .window_capacity(ctx.now_us, limit)
            .min(limit.saturating_sub(ahead))
            .saturating_sub(free);
        let cap = self.rebuild_cap(ctx, capacity);
        // A report about another window (a clock a little ahead or behind) still renews the
        // lease and its demand, but moves no counts.
        let report = (ask.epoch == index).then_some(ask);
        // A node's need is its demand over the horizon (until its next renewal, with one
        // interval of slack), and to the window's end only the demand it kept up across the
        // last boundary. A demand measured in a burst, extrapolated to the window's end, would
        // claim capacity the node never uses while a busier node is refused (an allowance only
        // comes back at its holder's renewals); a steady demand is split as Doorman splits a
        // rate, so a node asking less than an equal share gets it all, however late in the
        // window its hits come. See `docs/cluster.md`, "Bursts".
        let (allowance, fair) = grant_in(
            &mut self.current,
            report,
            ask,
            ctx,
            Limits {
                capacity,
                cap,
                need: Need::Window {
                    burst_us: horizon.min(left_us),
                    until_end_us: left_us,
                },
            },
        );
        // Grant the next window ahead when it starts before the node's next renewal arrives,
        // so a boundary needs no call and the nodes do not all ask at once.
        let next_allowance = ahead_due(left_us, horizon).then(|| self.grant_ahead(ask, ctx, index));
        let others = self.current.retired
            + self
                .current
                .holders
                .iter()
                .filter(|h| &*h.node != ctx.node)
                .map(|h| {
                    if h.expires_us > ctx.now_us {
                        h.used
                    } else {
                        h.allowance
                    }
                })
                .sum::<u64>();
        // A window's allowance is charged to the node for the whole window, so the lease
        // holds until the window (or the one granted ahead) ends; renewals move the counts.
        let ahead = match next_allowance {
            Some(_) => window.end_us(index + 1) - window.end_us(index),
            None => 0,
        };
        Grant {
            epoch: index,
            allowance,
            fair: Some(fair),
            next_allowance,
            valid_us: left_us + ahead,
            others,
            holders: self.current.live(ctx.now_us),
            leased: true,
        }
    }

    /// The node's allowance in the window after `index`, granted ahead. A fixed window's next
    /// capacity is its limit (or the owner's capacity for it); a sliding window's is what this window's allowances leave of it
    /// (its estimate at the next start is this window's count plus the next one's), and this
    /// window's later grants count against the grants ahead, so the two never pass the limit.
    fn grant_ahead(&mut self, ask: &Ask, ctx: &GrantContext<'_>, index: u64) -> u64 {
        let asked = ask.quota.requests_per_unit;
        self.next_limit = match self.next {
            Some(_) => window_limit(self.next_limit, asked),
            None => asked,
        };
        let limit = Self::limit_within(self.next_limit, ctx.capacity.next);
        let (window, window_secs) = (self.quota.window(), self.quota.window().secs());
        let next_start_us = window.start_us(index + 1);
        let unit_us = window.end_us(index + 1) - next_start_us;
        let free = match &self.next {
            Some(next) => self.free_reserve(next, ask, ctx, next_start_us, true),
            None => self.free_reserve(&Epoch::default(), ask, ctx, next_start_us, true),
        };
        let capacity = match self.quota.algorithm {
            Algorithm::SlidingWindow => limit.saturating_sub(self.current.allowances()),
            _ => limit,
        }
        .saturating_sub(free);
        // A rebuilding owner caps the grants ahead too: the holders it has not heard from yet
        // may be spending a safe capacity in that window (a child cluster cut off from a
        // parent that restarted empty), and they report only at their next renewal.
        let cap = self.rebuild_cap(ctx, capacity);
        let current = &self.current;
        let next = self
            .next
            .get_or_insert_with(|| Epoch::following(current, index + 1, window_secs));
        let demand_only = Ask { want: 0, ..*ask };
        let (raised, _) = grant_in(
            next,
            None,
            &demand_only,
            ctx,
            Limits {
                capacity,
                cap,
                need: Need::Window {
                    burst_us: ctx.horizon_us.min(unit_us),
                    until_end_us: unit_us,
                },
            },
        );
        raised
    }

    /// What the nodes other than the asker may have admitted freely of `epoch`, a window that
    /// began at `start_us` (`ahead`: granted before it began), as their permits say: each
    /// node's free share of the key's limit, less what the window already charges it (all of
    /// it once the node reported about the key in it). The limit is the largest the key's asks named, so a reload's larger limit is charged.
    fn free_reserve(
        &self,
        epoch: &Epoch,
        ask: &Ask,
        ctx: &GrantContext<'_>,
        start_us: u64,
        ahead: bool,
    ) -> u64 {
        if ctx.permits.is_empty() || !super::free::eligible(&self.quota) {
            return 0;
        }
        let limit = u64::from(self.limit.max(ask.quota.requests_per_unit));
        // A holder that reported decides the key from its lease for the rest of the window; one
        // granted an allowance in it (ahead, before its report) uses that or its free share,
        // never both, and the allowance is charged already.
        let covered = |node: &str| {
            epoch
                .holders
                .iter()
                .find(|h| &*h.node == node)
                .map_or(0, |h| if h.reported { u64::MAX } else { h.allowance })
        };
        Permits::reserve(
            ctx.permits,
            limit,
            (start_us, ctx.now_us, ahead),
            ctx.node,
            covered,
            |node| ctx.charged.borrow_mut().push(node),
        )
    }

    /// During a rebuild, the most any one node may hold: an equal share of `capacity` over the
    /// live nodes. Otherwise `capacity`.
    fn rebuild_cap(&self, ctx: &GrantContext<'_>, capacity: u64) -> u64 {
        if ctx.now_us < self.rebuild_until_us {
            capacity.div_ceil(ctx.live)
        } else {
            capacity
        }
    }

    fn answer_bucket(&mut self, ask: &Ask, ctx: &GrantContext<'_>) -> Grant {
        let whole = ctx.capacity.current.map_or(PPM, |c| c.min(PPM));
        let cap = self.rebuild_cap(ctx, whole);
        let (share, fair) = grant_in(
            &mut self.current,
            Some(ask),
            ask,
            ctx,
            Limits {
                capacity: whole,
                cap,
                need: Need::Share {
                    rate_milli: rate_milli(&self.quota),
                },
            },
        );
        Grant {
            epoch: 0,
            allowance: share,
            fair: Some(fair),
            next_allowance: None,
            valid_us: ctx.timing.duration_us(),
            others: 0,
            holders: self.current.live(ctx.now_us),
            leased: true,
        }
    }
}

/// How many times smaller a contended window's grants are than its horizon's need (the
/// default renewal of 100 ms: steps of 6.25 ms of a node's demand).
const CONTENDED_STEPS: u64 = 32;

/// The bounds of one grant.
#[derive(Clone, Copy)]
struct Limits {
    /// What all holders together may hold.
    capacity: u64,
    /// What one holder may hold (the rebuild cap).
    cap: u64,
    /// What a demand is worth.
    need: Need,
}

/// How a holder's demand becomes a need.
#[derive(Clone, Copy)]
enum Need {
    /// Windows: hits until the window's end at the part of the holder's demand that is steady
    /// ([`Holder::steady_milli`]), and over the next `burst_us` at the rest of it.
    /// after that at the part of it that is steady ([`Holder::steady_milli`]).
    Window { burst_us: u64, until_end_us: u64 },
    /// Buckets: a share (ppm) of a rate of `rate_milli` hits per second (thousandths), with a
    /// quarter of headroom so a node whose traffic grows is not refused before it renews.
    Share { rate_milli: u64 },
}

/// Records `ask` from `ctx.node` in `epoch` and raises its allowance to its fair part: the
/// node's allowance afterwards.
fn grant_in(
    epoch: &mut Epoch,
    report: Option<&Ask>,
    ask: &Ask,
    ctx: &GrantContext<'_>,
    limits: Limits,
) -> (u64, u64) {
    let window = matches!(limits.need, Need::Window { .. });
    epoch.retire(ctx.now_us, window);
    let Some(me) = epoch.holder(ctx.node, ctx.room) else {
        return (0, 0);
    };
    {
        let h = &mut epoch.holders[me];
        if let Some(r) = report {
            // What the node says it holds is what it holds: less when it gave some back, more
            // when another owner granted it (a rebuild, or owners that disagreed), and it is
            // never more than this server granted when only this server granted it. Reports
            // about one key from one node never cross (one call at a time per key).
            h.used = h.used.max(r.used);
            h.allowance = r.keep.max(h.used);
            h.reported = true;
        }
        if h.asked_at_us != 0 {
            let span = ctx.now_us.saturating_sub(h.asked_at_us);
            let asked = u128::from(ask.demand_milli) * u128::from(span) / 1_000_000;
            let asked = u64::try_from(asked).unwrap_or(u64::MAX);
            h.asked_milli = h.asked_milli.saturating_add(asked);
        }
        h.asked_at_us = ctx.now_us;
        h.demand_milli = ask.demand_milli;
        h.expires_us = ctx.now_us + ctx.timing.duration_us();
    }
    // Windows: each live holder claims what it used plus its need, out of the window's
    // capacity less what expired holders held (they may have used it all), so what a node
    // already used counts against its fair part. Buckets: claims are rate shares.
    let (available, mut claims) = self::claims(epoch, me, ask.want, ctx.now_us, &limits);
    if let Need::Window {
        burst_us,
        until_end_us,
    } = limits.need
        && claims.iter().sum::<u64>() > available
    {
        // Contended: what a node holds beyond its use is lost to the others until it gives it
        // back at a renewal, and a need measured in a burst is no promise of use. So the part
        // of each need that is not steady counts (and is handed out) in steps
        // [`CONTENDED_STEPS`] times shorter, and the window's last hits go to the nodes that
        // ask for them, much as one counter would give them.
        let step = Limits {
            need: Need::Window {
                burst_us: burst_us / CONTENDED_STEPS,
                until_end_us,
            },
            ..limits
        };
        claims = self::claims(epoch, me, ask.want, ctx.now_us, &step).1;
    }
    let mut fair: Claims = smallvec::smallvec![0; claims.len()];
    max_min_fair_into(available, &claims, &mut fair);
    let h = &epoch.holders[me];
    let target = fair[me].min(limits.cap);
    let held: u64 = epoch.allowances();
    let free = limits.capacity.saturating_sub(held);
    let raised = target.clamp(h.allowance, h.allowance + free);
    epoch.holders[me].allowance = raised;
    (raised, target)
}

/// One number per holder of a key, on the stack for up to eight holders: an ask's split
/// allocates nothing in a cluster of up to eight nodes.
type Claims = smallvec::SmallVec<[u64; 8]>;

/// What is left of `epoch`'s capacity to split once the expired holders' allowances are
/// charged, and each holder's claim on it: what it used (windows) plus its need, or `want` for
/// the asking holder `me` when that is more; 0 for an expired holder.
fn claims(epoch: &Epoch, me: usize, want: u64, now_us: u64, limits: &Limits) -> (u64, Claims) {
    let window = matches!(limits.need, Need::Window { .. });
    let mut expired = 0;
    let claims = epoch
        .holders
        .iter()
        .enumerate()
        .map(|(i, h)| {
            if h.expires_us <= now_us {
                expired += h.allowance;
                return 0;
            }
            let base = if window { h.used } else { 0 };
            let need = need_of(h.demand_milli, h.steady_milli, limits.need);
            let want = if i == me { want } else { 0 };
            base.saturating_add(need.max(want))
        })
        .collect();
    let charged = epoch.retired + expired;
    (limits.capacity.saturating_sub(charged), claims)
}

/// A holder's need, in what `need` measures, from its demand and (windows) the part of it
/// that is steady.
fn need_of(demand_milli: u64, steady_milli: u64, need: Need) -> u64 {
    let scaled = |rate: u64, num: u128, den: u128| {
        u64::try_from((u128::from(rate) * num).div_ceil(den)).unwrap_or(u64::MAX)
    };
    match need {
        Need::Window {
            burst_us,
            until_end_us,
        } => {
            // A steady demand holds its claim through a dip of the smoothed demand (one quiet
            // renewal interval halves it); a demand that stopped loses it within a few.
            let steady = steady_milli.min(demand_milli.saturating_mul(4));
            scaled(steady, until_end_us.into(), 1_000_000_000).saturating_add(scaled(
                demand_milli.saturating_sub(steady),
                burst_us.into(),
                1_000_000_000,
            ))
        }
        Need::Share { rate_milli } => {
            scaled(demand_milli, u128::from(PPM) * 5 / 4, rate_milli.into())
        }
    }
}
