//! A child cluster's side toward its parent, in a tree of lease servers (SLUICE_LEASE_PARENT,
//! issue 39, Doorman's server tree): the key's owner in the child cluster asks the parent
//! cluster for the key's capacity on behalf of its own holders, and its lease server hands out
//! at most that ([`super::LeaseServer::answer_within`]). The parent is an ordinary lease-mode
//! cluster that sees each child cluster as one holder, named after the cluster, so max-min fair
//! share at the parent divides the key between clusters by their holders' summed attempted
//! demand; the root's capacity is the configured limit. Any depth.
//!
//! This is the logic, with no I/O ([`super::parent_link`] makes the calls):
//!
//! - **Capacity** ([`Upstream::capacity`]): the parent's grant for the window (or, granted
//!   ahead, the next one), while its lease holds. With no grant for the window the owner grants
//!   nothing new and asks the parent at once; once calls to the parent fail, it uses the
//!   **safe capacity** (the limit's YAML `safe_capacity`, else the limit over the clusters the
//!   parent last counted holding the key, or any key; before the parent ever answered, over
//!   SLUICE_LEASE_PARENT_EXPECTED_CLUSTERS) for each window its last grant does not cover.
//! - **Renewals** ([`Upstream::renewals`]): every SLUICE_LEASE_PARENT_RENEW_MS one ask per key,
//!   carrying what the cluster's holders used and hold, their summed demand, and what to keep:
//!   what they hold plus their need until the next grant can arrive, within what was granted.
//!   The rest goes back to the parent for the other clusters.
//! - **Horizon**: the asks carry one that covers the renewal interval and the round trip, so
//!   the parent grants the next window ahead early enough to arrive before it starts.
//! - **Learning**: a child owner that starts without state (its own start, or a ring change in
//!   its cluster) reports what its holders hold as held; a parent that starts without state
//!   rebuilds from those reports, capping grants at an equal share for a lease duration, as
//!   any lease owner does after a ring change ([`super::server`], "Rebuild").

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use super::server::{Capacity, PPM, Summary};
use super::window::{epoch_of, is_window, micros, same_counter};
use super::{Ask, Grant};
use crate::charged::{ChargedMap, lock};
use crate::limiter::Quota;
use crate::limiter::demand::hits_within;
use crate::limiter::granted::Granted;

/// SLUICE_LEASE_PARENT_RENEW_MS and SLUICE_LEASE_PARENT_TIMEOUT_MS, with the lease table bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParentTiming {
    /// How often the key owners renew at the parent.
    pub renew: Duration,
    /// The deadline of a call to the parent.
    pub timeout: Duration,
    /// How long a key with no ask from the cluster's holders is kept (a lease duration).
    pub idle: Duration,
    /// SLUICE_LEASE_MAX_BYTES: the memory the parent grants may take, charged per key.
    pub max_bytes: usize,
}

/// What a key costs beside its key's bytes (its `DashMap` slot, the `Mutex<Above>`, the boxed key's
/// allocation): `bench/programs/src/bin/lease_memory.rs` measures at most 360 with the key (keys of
/// 27 to 31 bytes, 40,000 to 300,000 keys), which this rounds up; the program fails when a
/// measurement passes the charge.
pub const ABOVE_CHARGE: usize = 384;

/// Where a window's capacity came from, for the debug endpoint and `/metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The parent's grant.
    Parent,
    /// No grant for the window yet: nothing new is granted until the parent answers.
    Waiting,
    /// The parent is unreachable, or refused to lease the key: the safe capacity.
    Safe,
}

/// One key's grant from the parent.
#[derive(Clone, Debug)]
struct Above {
    /// The limit's `safe_capacity`, as the cluster's holders last sent it.
    safe: Option<NonZeroU32>,
    quota: Quota,
    /// The parent's grant: its window (0 for a bucket), its hits (a bucket: the share in ppm)
    /// and the next window's, granted ahead; `None` before the first grant. What the cluster's
    /// holders use of it is theirs to report ([`Summary`]), not counted here.
    grant: Option<Granted>,
    fair: Option<u64>,
    /// The parent's live holders of the key (the clusters), for the dynamic safe capacity.
    holders: u32,
    valid_until_us: u64,
    /// The parent does not lease the key (its table is full).
    refused: bool,
    /// When the call under way about the key was sent.
    in_flight: Option<u64>,
    /// When the cluster's holders last asked about the key (µs).
    touched_us: u64,
}

/// What the parent granted, per key; see the module doc.
pub struct Upstream {
    keys: ChargedMap<Above>,
    timing: ParentTiming,
    /// Since when (µs) every call to the parent failed; 0 while it answers.
    unreachable_since_us: AtomicU64,
    /// The longest round trip of the last calls (µs), decaying: what the horizon covers.
    rtt_us: AtomicU64,
    /// The clusters the parent last counted on any key: the dynamic safe capacity's divisor
    /// for a key it never answered about (0 before any answer).
    children: AtomicU32,
    /// SLUICE_LEASE_PARENT_EXPECTED_CLUSTERS: the divisor until the parent counted any.
    expected: NonZeroU32,
    /// Whether any call to the parent ever succeeded.
    reached: AtomicBool,
    pub stats: ParentStats,
}

/// What the link to the parent did, for `/stats` and `/metrics`.
#[derive(Debug, Default)]
pub struct ParentStats {
    /// Calls to the parent, and those that failed.
    pub calls: AtomicU64,
    pub failures: AtomicU64,
    /// Keys asked about in those calls.
    pub asks: AtomicU64,
    /// Answers to this cluster's nodes from the safe capacity (the parent unreachable).
    pub safe_answers: AtomicU64,
}

/// One key's parent grant, for the debug endpoint.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ParentView {
    /// The parent node asked about the key.
    pub parent: String,
    pub source: Source,
    /// The window and what the parent granted for it (a bucket: the share in ppm).
    pub epoch: Option<u64>,
    pub allowance: u64,
    pub next_allowance: Option<u64>,
    pub fair: Option<u64>,
    /// The clusters holding the key at the parent.
    pub children: u32,
    pub expires_in_ms: u64,
    pub safe_capacity: u64,
}

/// The link's state as a whole, for the status page and the warnings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParentState {
    /// Whether any call to the parent ever succeeded.
    pub reached: bool,
    /// Whether calls to the parent are failing now.
    pub unreachable: bool,
    /// The safe capacity's divisor for a limit without a YAML `safe_capacity` (on a key the
    /// parent never counted): the clusters the parent last counted, else the expected ones.
    pub clusters: u32,
    /// Whether `clusters` is SLUICE_LEASE_PARENT_EXPECTED_CLUSTERS (the parent counted none).
    pub expected: bool,
}

impl Upstream {
    /// The parent link's logic, with `expected` child clusters until the parent counts them.
    pub fn new(timing: ParentTiming, expected: NonZeroU32) -> Self {
        Upstream {
            keys: ChargedMap::new(ABOVE_CHARGE, timing.max_bytes),
            timing,
            unreachable_since_us: AtomicU64::new(0),
            rtt_us: AtomicU64::new(micros(timing.timeout) / 2),
            children: AtomicU32::new(0),
            expected,
            reached: AtomicBool::new(false),
            stats: ParentStats::default(),
        }
    }

    pub fn timing(&self) -> &ParentTiming {
        &self.timing
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.keys.bytes()
    }

    /// Whether calls to the parent are failing.
    pub fn unreachable(&self) -> bool {
        self.unreachable_since_us.load(Ordering::Relaxed) != 0
    }

    /// Since when (µs) calls to the parent fail, as [`Upstream::lost`] warned then; 0 while it
    /// answers.
    pub(crate) fn unreachable_since_us(&self) -> u64 {
        self.unreachable_since_us.load(Ordering::Relaxed)
    }

    /// Whether any call to the parent ever succeeded.
    pub fn reached(&self) -> bool {
        self.reached.load(Ordering::Relaxed)
    }

    /// The clusters the parent last counted on any key, else the expected ones: the dynamic
    /// safe capacity's divisor for a key the parent never counted.
    fn clusters(&self) -> u32 {
        match self.children.load(Ordering::Relaxed) {
            0 => self.expected.get(),
            n => n,
        }
    }

    /// The link's state, for the status page and the warnings.
    pub fn state(&self) -> ParentState {
        ParentState {
            reached: self.reached(),
            unreachable: self.unreachable(),
            clusters: self.clusters(),
            expected: self.children.load(Ordering::Relaxed) == 0,
        }
    }

    /// What the owner may hand out of `key` under `quota` at `now_us`, where that came from,
    /// and whether the parent should be asked at once (no grant for the window, and no call
    /// under way). A key new here is recorded; past SLUICE_LEASE_MAX_BYTES it is not, and gets
    /// the limit's YAML `safe_capacity` (or nothing) in every window.
    pub fn capacity(&self, key: &str, quota: &Quota, now_us: u64) -> (Capacity, Source, bool) {
        let bare = Quota {
            safe_capacity: None,
            ..*quota
        };
        let unrecorded = || {
            let safe = quota.safe_capacity.map_or(0, |s| u64::from(s.get()));
            let safe = Some(safe_in(quota, safe));
            let capacity = Capacity {
                current: safe,
                next: safe,
            };
            (capacity, Source::Safe, false)
        };
        let fresh = || Above::new(bare, quota.safe_capacity, now_us);
        let Some(entry) = self.keys.get_or_insert(key, fresh) else {
            self.stats.safe_answers.fetch_add(1, Ordering::Relaxed);
            return unrecorded();
        };
        let mut above = lock(&entry);
        // A reload changes a limit on one node after another: under another limit the grant
        // stays (the parent keeps its record too, docs/cluster.md "A limit changed while nodes
        // hold leases"); another counter has nothing granted yet.
        if !same_counter(&above.quota, &bare) {
            *above = Above::new(bare, quota.safe_capacity, now_us);
        }
        above.quota = bare;
        above.safe = quota.safe_capacity.or(above.safe);
        above.touched_us = now_us;
        above.roll(now_us);
        let unreachable = self.unreachable() || above.refused;
        let (capacity, source) = above.capacity(now_us, unreachable, self.clusters());
        if source == Source::Safe {
            self.stats.safe_answers.fetch_add(1, Ordering::Relaxed);
        }
        let ask_now = source == Source::Waiting && above.in_flight.is_none();
        (capacity, source, ask_now)
    }

    /// The renewals due at `now_us`: one ask per key with no call under way, built from what
    /// the cluster's holders do (`summary`, the owner's lease server), marking each in flight.
    /// With `acquire`, only those keys (no grant for the window), each with the asks of the
    /// holders waiting on it: their wants are the ask's, and their demand counts. Keys this
    /// node no longer `owns` are not renewed (their new owner in the cluster renews them under
    /// the same name); keys the holders have not asked about for a lease duration, with
    /// nothing granted, are forgotten.
    pub fn renewals(
        &self,
        now_us: u64,
        acquire: Option<&[(&str, Ask)]>,
        owns: impl Fn(&str) -> bool,
        summary: impl Fn(&str) -> Option<Summary>,
    ) -> Vec<(Box<str>, Ask)> {
        let horizon_us = self.horizon_us();
        let lead_us = micros(self.timing.renew) + self.rtt_us.load(Ordering::Relaxed);
        let mut due = Vec::new();
        let mut idle: Vec<Box<str>> = Vec::new();
        let mut one = |key: &str, above: &mut Above, waiting: Option<&Ask>| {
            if above.in_flight.is_some() {
                return;
            }
            if waiting.is_none() && above.idle(now_us, micros(self.timing.idle)) {
                idle.push(key.into());
                return;
            }
            if !owns(key) {
                return;
            }
            let mut done = summary(key).unwrap_or_default();
            let want = waiting.map_or(0, |w| {
                done.demand_milli = done.demand_milli.saturating_add(w.demand_milli);
                w.want
            });
            above.in_flight = Some(now_us);
            let ask = above.ask(now_us, done, lead_us, horizon_us);
            due.push((key.into(), Ask { want, ..ask }));
        };
        match acquire {
            Some(waiting) => {
                for (key, ask) in waiting {
                    if let Some(e) = self.keys.get(key) {
                        let mut above = lock(&e);
                        one(key, &mut above, Some(ask));
                    }
                }
            }
            None => {
                for e in self.keys.iter() {
                    one(e.key(), &mut lock(&e), None);
                }
            }
        }
        for key in idle {
            self.keys
                .remove_if(&key, |a| a.idle(now_us, micros(self.timing.idle)));
        }
        due
    }

    /// How far ahead the parent's grants must look: until this cluster's next renewal at the
    /// parent has come back (one interval and a round trip), with one interval of slack.
    fn horizon_us(&self) -> u64 {
        micros(self.timing.renew) * 2 + self.rtt_us.load(Ordering::Relaxed)
    }

    /// The parent's answer to the ask about `key` sent at `sent_us` (`None`: the call failed).
    pub fn answer(&self, key: &str, grant: Option<&Grant>, sent_us: u64) {
        if let Some(g) = grant.filter(|g| g.holders > 0) {
            self.children.store(g.holders, Ordering::Relaxed);
        }
        if let Some(e) = self.keys.get(key) {
            lock(&e).answer(grant, sent_us);
        }
    }

    /// A call sent at `sent_us` came back (`ok`) or failed at `now_us`: the parent's
    /// reachability and the round trip the horizon covers.
    pub fn called(&self, ok: bool, sent_us: u64, now_us: u64) {
        self.stats.calls.fetch_add(1, Ordering::Relaxed);
        if ok {
            let first = !self.reached.swap(true, Ordering::Relaxed);
            if self.unreachable_since_us.swap(0, Ordering::Relaxed) != 0 || first {
                tracing::info!(first, "the lease parent answers");
            }
            // The longest recent round trip, decaying by an eighth a call.
            let rtt = now_us.saturating_sub(sent_us);
            let old = self.rtt_us.load(Ordering::Relaxed);
            self.rtt_us.store(rtt.max(old - old / 8), Ordering::Relaxed);
        } else {
            self.stats.failures.fetch_add(1, Ordering::Relaxed);
            self.lost(now_us);
        }
    }

    /// No parent peer could be asked at `now_us` (every one failed a call within the last
    /// second), or a call failed: the parent is unreachable from then.
    pub fn lost(&self, now_us: u64) {
        let was = self.unreachable_since_us.compare_exchange(
            0,
            now_us.max(1),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        if was.is_ok()
            && let Some(warning) = self.warning()
        {
            tracing::warn!("{warning}");
        }
    }

    /// What the link warns of now, for the logs: `None` while the parent answers. (The parent
    /// counts the clusters only in its answers: until one, the divisor is the expected count.)
    pub fn warning(&self) -> Option<String> {
        let clusters = self.clusters();
        if !self.reached() {
            return Some(format!(
                "the lease parent has never answered: each limit admits only its safe capacity \
                 in this cluster, its YAML safe_capacity, else the limit / {clusters} \
                 (SLUICE_LEASE_PARENT_EXPECTED_CLUSTERS) per window; check SLUICE_LEASE_PARENT \
                 and that the parent is up"
            ));
        }
        self.unreachable().then(|| {
            format!(
                "the lease parent is unreachable: each cluster owner keeps its last grants \
                 while their leases hold, then hands out each limit's safe capacity (its YAML \
                 safe_capacity, else the limit / {clusters} per window)"
            )
        })
    }

    /// `key`'s parent grant at `now_us`, for the debug endpoint.
    pub fn view(&self, key: &str, parent: &str, now_us: u64) -> Option<ParentView> {
        let e = self.keys.get(key)?;
        let a = lock(&e);
        let clusters = self.clusters();
        let (_, source) = a.capacity(now_us, self.unreachable() || a.refused, clusters);
        Some(ParentView {
            parent: parent.to_owned(),
            source,
            epoch: a.grant.map(|g| g.window),
            allowance: a.grant.map_or(0, |g| g.granted),
            next_allowance: a.grant.and_then(|g| g.ahead).map(|(hits, _)| hits),
            fair: a.fair,
            children: a.holders,
            expires_in_ms: a.valid_until_us.saturating_sub(now_us) / 1000,
            safe_capacity: a.safe_capacity(clusters),
        })
    }
}

/// A safe capacity of `safe` hits per window as `quota`'s lease measures it: the hits for a
/// window, a share (ppm) for a bucket.
fn safe_in(quota: &Quota, safe: u64) -> u64 {
    if is_window(quota) {
        safe
    } else {
        let limit = u64::from(quota.requests_per_unit).max(1);
        (u128::from(safe) * u128::from(PPM) / u128::from(limit)) as u64
    }
}

impl Above {
    fn new(quota: Quota, safe: Option<NonZeroU32>, now_us: u64) -> Self {
        Above {
            safe,
            quota,
            grant: None,
            fair: None,
            holders: 0,
            valid_until_us: 0,
            refused: false,
            in_flight: None,
            touched_us: now_us,
        }
    }

    /// The safe capacity in hits per window: the YAML's, else the limit over the clusters the
    /// parent last counted on the key (or, never answered about it, `clusters`: those it
    /// counted on any key, else SLUICE_LEASE_PARENT_EXPECTED_CLUSTERS).
    fn safe_capacity(&self, clusters: u32) -> u64 {
        let limit = u64::from(self.quota.requests_per_unit);
        let holders = if self.holders > 0 {
            self.holders
        } else {
            clusters
        };
        match (self.safe, holders) {
            (Some(s), _) => u64::from(s.get()).min(limit),
            (None, 0) => 0,
            (None, n) => limit / u64::from(n),
        }
    }

    /// Moves to the window at `now_us` when the parent granted it ahead: what this owner then
    /// keeps of it at a renewal lowers the grant it hands out from, as for a current grant.
    fn roll(&mut self, now_us: u64) {
        if !is_window(&self.quota) {
            return;
        }
        let index = epoch_of(&self.quota, now_us);
        if let Some(grant) = &mut self.grant
            && grant.advance(index)
        {
            self.fair = None;
        }
    }

    /// The grant for the window at `now_us` (the current one, or the next one granted ahead),
    /// while its lease holds.
    fn granted(&self, now_us: u64) -> (Option<u64>, Option<u64>) {
        let Some(grant) = self.grant.filter(|_| now_us < self.valid_until_us) else {
            return (None, None);
        };
        if !is_window(&self.quota) {
            return (Some(grant.granted), None);
        }
        grant.for_window(epoch_of(&self.quota, now_us))
    }

    /// Whether the parent's grant is for window `epoch`.
    fn granted_for(&self, epoch: u64) -> bool {
        self.grant.is_some_and(|g| g.window == epoch)
    }

    fn capacity(&self, now_us: u64, unreachable: bool, clusters: u32) -> (Capacity, Source) {
        let (current, next) = self.granted(now_us);
        let safe = Some(safe_in(&self.quota, self.safe_capacity(clusters)));
        match (current, unreachable) {
            (Some(c), _) => (
                Capacity {
                    current: Some(c),
                    next: next.or(if unreachable { safe } else { Some(0) }),
                },
                Source::Parent,
            ),
            (None, true) => (
                Capacity {
                    current: safe,
                    next: safe,
                },
                Source::Safe,
            ),
            (None, false) => (
                Capacity {
                    current: Some(0),
                    next: Some(0),
                },
                Source::Waiting,
            ),
        }
    }

    fn idle(&self, now_us: u64, idle_us: u64) -> bool {
        self.in_flight.is_none()
            && now_us >= self.touched_us.saturating_add(idle_us)
            && now_us >= self.valid_until_us
    }

    /// The ask for the window at `now_us`: the holders' use, hold and demand, keeping what they
    /// hold plus their need for `lead_us` (until the next grant can arrive) within the grant.
    fn ask(&mut self, now_us: u64, done: Summary, lead_us: u64, horizon_us: u64) -> Ask {
        self.roll(now_us);
        let epoch = epoch_of(&self.quota, now_us);
        let (granted, _) = self.granted(now_us);
        let keep = if is_window(&self.quota) {
            let want = done
                .used
                .saturating_add(hits_within(done.demand_milli, lead_us));
            // What the holders hold is held, granted or not (a safe capacity handed out, or a
            // grant this owner does not know of after a ring change): the parent learns it.
            // Within the parent's fair part, so a cluster holding more (it asked first) gives
            // the excess back for the others.
            let fair = match self.fair {
                Some(f) if self.granted_for(epoch) => f,
                _ => u64::MAX,
            };
            let keep = match granted {
                Some(g) => g.min(want).min(fair).max(done.held),
                None => done.held,
            };
            if let Some(grant) = self.grant.as_mut().filter(|g| g.window == epoch)
                && granted.is_some()
            {
                grant.granted = keep;
            }
            keep
        } else {
            // A bucket's share is what its holders' shares sum to (they only lower it).
            done.held.min(PPM)
        };
        Ask {
            quota: Quota {
                safe_capacity: self.safe,
                ..self.quota
            },
            epoch,
            used: done.used,
            keep,
            want: 0,
            demand_milli: done.demand_milli,
            horizon_us,
        }
    }

    fn answer(&mut self, grant: Option<&Grant>, sent_us: u64) {
        self.in_flight = None;
        let Some(g) = grant else {
            return;
        };
        self.refused = !g.leased;
        if !g.leased {
            return;
        }
        self.grant = Some(Granted {
            window: g.epoch,
            granted: g.allowance,
            ahead: g.next_allowance.map(|a| (a, ())),
            ..Granted::default()
        });
        self.fair = g.fair;
        if g.holders > 0 {
            self.holders = g.holders;
        }
        self.valid_until_us = sent_us.saturating_add(g.valid_us);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Unit;

    const T0: u64 = 1_700_000_000_000_000;
    const MS: u64 = 1_000;

    fn upstream() -> Upstream {
        expecting(2)
    }

    fn expecting(clusters: u32) -> Upstream {
        let timing = ParentTiming {
            renew: Duration::from_millis(200),
            timeout: Duration::from_millis(400),
            idle: Duration::from_secs(1),
            max_bytes: 1 << 20,
        };
        Upstream::new(timing, NonZeroU32::new(clusters).unwrap())
    }

    fn quota(safe: Option<u32>) -> Quota {
        Quota {
            safe_capacity: safe.and_then(NonZeroU32::new),
            ..Quota::fixed(100, Unit::Second)
        }
    }

    fn grant(epoch: u64, allowance: u64, next: Option<u64>, holders: u32) -> Grant {
        Grant {
            epoch,
            allowance,
            fair: Some(allowance),
            next_allowance: next,
            valid_us: 2_000 * MS,
            others: 0,
            holders,
            leased: true,
        }
    }

    fn waiting(q: Quota, want: u64, demand_milli: u64) -> Ask {
        Ask {
            quota: q,
            epoch: 0,
            used: 0,
            keep: 0,
            want,
            demand_milli,
            horizon_us: 0,
        }
    }

    #[test]
    fn a_new_key_grants_nothing_and_asks_the_parent_at_once_then_serves_its_grants() {
        let up = upstream();
        let q = quota(None);
        let e = epoch_of(&q, T0);
        let (c, source, ask_now) = up.capacity("k", &q, T0);
        assert_eq!(
            (c.current, c.next, source, ask_now),
            (Some(0), Some(0), Source::Waiting, true)
        );
        let due = up.renewals(
            T0,
            Some(&[("k", waiting(q, 3, 40_000))]),
            |_| true,
            |_| None,
        );
        assert_eq!(due.len(), 1);
        let ask = due[0].1;
        assert_eq!((ask.want, ask.demand_milli, ask.epoch), (3, 40_000, e));
        // The horizon covers two renewals at the parent and the round trip (half the timeout
        // until one is measured).
        assert_eq!(ask.horizon_us, 600 * MS);
        // A call under way: no second ask.
        assert!(!up.capacity("k", &q, T0 + MS).2);
        assert!(up.renewals(T0 + MS, None, |_| true, |_| None).is_empty());
        up.answer("k", Some(&grant(e, 40, Some(55), 3)), T0);
        let (c, source, _) = up.capacity("k", &q, T0 + 2 * MS);
        assert_eq!(
            (c.current, c.next, source),
            (Some(40), Some(55), Source::Parent)
        );
        // The next window runs on what was granted ahead; its own next is not granted yet.
        let later = T0 + 1_000 * MS;
        let (c, source, _) = up.capacity("k", &q, later);
        assert_eq!(
            (c.current, c.next, source),
            (Some(55), Some(0), Source::Parent)
        );
        // What a renewal keeps of it is what the owner hands out from until the next grant
        // (the parent may give the rest to another cluster meanwhile).
        let done = Summary {
            epoch: e + 1,
            used: 4,
            held: 10,
            demand_milli: 0,
        };
        let due = up.renewals(later + MS, None, |_| true, |_| Some(done));
        assert_eq!((due[0].1.epoch, due[0].1.keep), (e + 1, 10));
        assert_eq!(up.capacity("k", &q, later + 2 * MS).0.current, Some(10));
    }

    #[test]
    fn a_changed_limit_keeps_the_parents_grant_and_another_counter_waits_for_its_own() {
        let up = upstream();
        let q = quota(None);
        let e = epoch_of(&q, T0);
        up.capacity("k", &q, T0);
        up.renewals(
            T0,
            Some(&[("k", waiting(q, 3, 40_000))]),
            |_| true,
            |_| None,
        );
        up.answer("k", Some(&grant(e, 40, Some(55), 3)), T0);
        // The cluster's nodes reload one after another: asks under both limits interleave,
        // and the grant holds for both (before issue 48's fix each one started it again).
        let halved = Quota {
            requests_per_unit: 50,
            ..q
        };
        for (i, asked) in [halved, q, halved].iter().enumerate() {
            let (c, source, _) = up.capacity("k", asked, T0 + (i as u64 + 1) * MS);
            assert_eq!((c.current, source), (Some(40), Source::Parent), "ask {i}");
        }
        // Another algorithm is another counter: nothing granted for it yet.
        let sliding = q.with_algorithm(crate::limiter::Algorithm::SlidingWindow);
        let (c, source, ask_now) = up.capacity("k", &sliding, T0 + 5 * MS);
        assert_eq!(
            (c.current, source, ask_now),
            (Some(0), Source::Waiting, true)
        );
    }

    #[test]
    fn a_renewal_keeps_what_is_used_and_the_need_until_the_next_grant_within_the_fair_part() {
        let up = upstream();
        let q = quota(None);
        let e = epoch_of(&q, T0);
        up.capacity("k", &q, T0);
        up.answer("k", Some(&grant(e, 80, None, 2)), T0);
        let done = Summary {
            epoch: e,
            used: 8,
            held: 10,
            demand_milli: 100_000,
        };
        // Need for the renewal interval and the round trip (200 + 200 ms) at 100/s: 40, and 8
        // used: keep 48 of the 80 granted, giving 32 back.
        let due = up.renewals(T0 + MS, None, |_| true, |_| Some(done));
        assert_eq!(
            (due[0].1.used, due[0].1.keep, due[0].1.demand_milli),
            (8, 48, 100_000)
        );
        assert_eq!(up.capacity("k", &q, T0 + 2 * MS).0.current, Some(48));
        // What the holders hold is kept whatever the need.
        up.answer("k", Some(&grant(e, 48, None, 2)), T0 + MS);
        let idle = Summary {
            demand_milli: 0,
            ..done
        };
        let due = up.renewals(T0 + 3 * MS, None, |_| true, |_| Some(idle));
        assert_eq!(due[0].1.keep, 10);
    }

    #[test]
    fn an_unreachable_parent_leaves_the_last_grant_then_the_safe_capacity() {
        let up = upstream();
        let q = quota(None);
        let e = epoch_of(&q, T0);
        up.capacity("k", &q, T0);
        up.answer("k", Some(&grant(e, 70, None, 4)), T0);
        up.called(false, T0 + 10 * MS, T0 + 20 * MS);
        assert!(up.unreachable());
        let (c, source, ask_now) = up.capacity("k", &q, T0 + 30 * MS);
        // The window's grant stands; the next window gets the safe capacity: the limit over
        // the 4 clusters the parent counted.
        assert_eq!(
            (c.current, c.next, source, ask_now),
            (Some(70), Some(25), Source::Parent, false)
        );
        let (c, source, _) = up.capacity("k", &q, T0 + 1_000 * MS);
        assert_eq!((c.current, source), (Some(25), Source::Safe));
        // The YAML's safe capacity comes first.
        let (c, _, _) = up.capacity("k", &quota(Some(10)), T0 + 1_000 * MS);
        assert_eq!(c.current, Some(10), "{c:?}");
        // A key the parent never answered about divides by the clusters it counted on others.
        let (c, source, _) = up.capacity("new", &q, T0 + 1_000 * MS);
        assert_eq!((c.current, source), (Some(25), Source::Safe));
        // Before any answer at all, the limit over the clusters expected (2 here).
        let fresh = upstream();
        fresh.called(false, T0, T0 + MS);
        assert_eq!(fresh.capacity("k", &q, T0 + 2 * MS).0.current, Some(50));
        // Answering again ends it.
        up.called(true, T0 + 1_100 * MS, T0 + 1_200 * MS);
        assert!(!up.unreachable());
        assert_eq!(up.capacity("k", &q, T0 + 1_300 * MS).1, Source::Waiting);
        assert_eq!(up.stats.safe_answers.load(Ordering::Relaxed), 3);
        assert_eq!(fresh.stats.safe_answers.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_parent_never_reached_leaves_the_yaml_safe_capacity_else_the_limit_over_the_expected_clusters()
     {
        let up = expecting(4);
        let q = quota(None);
        // Nothing failed yet: the owner asks first, granting nothing new meanwhile.
        assert_eq!(up.capacity("k", &q, T0).1, Source::Waiting);
        let state = up.state();
        assert!(!state.reached && !state.unreachable, "{state:?}");
        assert!(up.warning().unwrap().contains("never answered"));
        up.called(false, T0, T0 + MS);
        let (c, source, ask_now) = up.capacity("k", &q, T0 + 2 * MS);
        assert_eq!(
            (c.current, c.next, source, ask_now),
            (Some(25), Some(25), Source::Safe, false)
        );
        assert_eq!(up.view("k", "p", T0 + 2 * MS).unwrap().safe_capacity, 25);
        // The YAML's safe capacity comes first, above the part or below it.
        assert_eq!(up.capacity("y", &quota(Some(40)), T0).0.current, Some(40));
        assert_eq!(up.capacity("z", &quota(Some(5)), T0).0.current, Some(5));
        // A bucket gets the part as a share.
        let bucket = Quota {
            algorithm: crate::limiter::Algorithm::TokenBucket,
            ..q
        };
        assert_eq!(up.capacity("b", &bucket, T0).0.current, Some(250_000));
        assert_eq!(
            up.state(),
            ParentState {
                reached: false,
                unreachable: true,
                clusters: 4,
                expected: true
            }
        );
        let warning = up.warning().unwrap();
        assert!(
            warning.contains("limit / 4 (SLUICE_LEASE_PARENT_EXPECTED_CLUSTERS)"),
            "{warning}"
        );
        // Once the parent counts the clusters (3 here), its count is the divisor.
        up.called(true, T0 + 3 * MS, T0 + 4 * MS);
        up.answer(
            "k",
            Some(&grant(epoch_of(&q, T0), 10, None, 3)),
            T0 + 3 * MS,
        );
        assert_eq!(up.warning(), None);
        up.called(false, T0 + 5 * MS, T0 + 6 * MS);
        assert_eq!(up.capacity("new", &q, T0 + 1_000 * MS).0.current, Some(33));
        let state = up.state();
        assert!(
            state.reached && state.unreachable && !state.expected,
            "{state:?}"
        );
        assert!(up.warning().unwrap().contains("limit / 3 per window"));
    }

    #[test]
    fn a_bucket_gets_the_parents_share_and_the_safe_capacity_as_a_share() {
        let up = upstream();
        let q = Quota {
            safe_capacity: NonZeroU32::new(25),
            ..Quota::fixed(100, Unit::Second).with_algorithm(crate::limiter::Algorithm::TokenBucket)
        };
        up.capacity("b", &q, T0);
        up.answer("b", Some(&grant(0, 300_000, None, 2)), T0);
        assert_eq!(up.capacity("b", &q, T0 + MS).0.current, Some(300_000));
        up.called(false, T0, T0 + MS);
        assert_eq!(
            up.capacity("b", &q, T0 + 3_000 * MS).0.current,
            Some(250_000)
        );
    }

    #[test]
    fn idle_keys_are_forgotten_and_their_bytes_returned() {
        let up = upstream();
        let q = quota(None);
        up.capacity("k", &q, T0);
        assert_eq!(up.bytes(), ABOVE_CHARGE + 1);
        assert!(up.renewals(T0 + 999 * MS, None, |_| true, |_| None).len() == 1);
        up.answer("k", None, T0 + 999 * MS);
        assert!(
            up.renewals(T0 + 1_000 * MS, None, |_| true, |_| None)
                .is_empty()
        );
        assert_eq!((up.len(), up.bytes()), (0, 0));
    }

    #[test]
    fn a_key_this_node_no_longer_owns_is_not_renewed_under_the_clusters_name() {
        let up = upstream();
        let q = quota(None);
        up.capacity("k", &q, T0);
        assert!(up.renewals(T0 + MS, None, |_| false, |_| None).is_empty());
        assert_eq!(up.renewals(T0 + MS, None, |_| true, |_| None).len(), 1);
    }
}
