//! The Rate Limit Quota Service's state (`envoy.service.rate_limit_quota.v3`, for Envoy's
//! `rate_limit_quota` filter), free of protocol types: [`crate::api::rlqs`] decodes the streams.
//!
//! Envoy sorts requests into buckets, enforces each bucket's assignment locally, and reports
//! every bucket's usage (allowed and denied requests) on one stream per reporting interval.
//! This module maps a bucket to the same YAML as ratelimit.v3 (the stream's domain, and one
//! descriptor of the bucket id's entries, keys in [`KeyOrder`]), splits a limited bucket's rate
//! among every Envoy reporting it ([`bucket`]: max-min fair on attempted demand), and says what
//! to send each Envoy ([`assign`]: a token bucket or a blanket rule, with a time to live).
//!
//! - A report is answered at once with an assignment for every bucket it names; a change to
//!   another Envoy's part is pushed on that Envoy's stream ([`RlqsStream::pending`]).
//! - An Envoy whose stream ends keeps its part reserved until its assignment expires; the sweep
//!   ([`RlqsService::sweep`]) then frees it and pushes the larger parts to the others. A bucket
//!   an Envoy has reported no attempt for in SLUICE_RLQS_ABANDON_IDLE_SECS is abandoned
//!   (Envoy forgets it, and reports it again with its next request).
//! - Memory is bounded by SLUICE_RLQS_MAX_BYTES: each bucket and each holder is charged its
//!   key or bucket id plus a fixed overhead; past it a new bucket gets no assignment (Envoy
//!   applies its `no_assignment_behavior`) and is counted as refused.

pub(crate) mod assign;
pub(crate) mod bucket;
pub(crate) mod remote;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;

pub use assign::Rate;
pub(crate) use assign::{Assignment, Policy};
use bucket::{Bucket, Holder};
pub(crate) use remote::{RlqsPeers, SyncBucket, SyncHolder};

use crate::clock::Clock;
use crate::config::{ConfigHandle, RateLimitConfig};
use crate::descriptor::Entry;
use crate::key::{bucket_key_len, write_bucket_key};

/// Bytes charged per bucket beyond its key, and per holder beyond its bucket id's strings (and 48
/// per entry): above what they take, measured with `cargo run --release -p sluice-bench --bin
/// rlqs_memory -- 100000 3` (docs/rlqs.md): the map entry and rate; the holder, its shared id, its
/// stream's record of it, and the allocator's share of the holders' vector growing by one.
pub(crate) const BUCKET_CHARGE: usize = 192;
pub const HOLDER_CHARGE: usize = 384;
pub(crate) const ENTRY_CHARGE: usize = 48;

/// How the bucket id's entries are ordered into a descriptor: keys named in SLUICE_RLQS_KEY_ORDER
/// first, in that order, then the others sorted bytewise.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyOrder(Vec<String>);

impl KeyOrder {
    pub fn new(keys: Vec<String>) -> Self {
        KeyOrder(keys)
    }

    pub fn keys(&self) -> &[String] {
        &self.0
    }

    /// Sorts `entries` into descriptor order.
    pub fn sort(&self, entries: &mut [Entry]) {
        let rank = |k: &str| self.0.iter().position(|o| o == k).unwrap_or(self.0.len());
        entries.sort_by(|a, b| {
            rank(&a.key)
                .cmp(&rank(&b.key))
                .then_with(|| a.key.as_bytes().cmp(b.key.as_bytes()))
        });
    }
}

/// The limits of `config` no `rate_limit_quota` bucket can reach, one line each naming the
/// limit and why: a bucket id has each key once, and its entries become a descriptor in `order`,
/// so a path that repeats a key, or whose keys are in another order, never matches a bucket.
/// (ratelimit.v3 requests still reach them: `check-config --rlqs` reports, it does not refuse.)
pub(crate) fn unreachable_by_buckets(config: &RateLimitConfig, order: &KeyOrder) -> Vec<String> {
    let mut out = Vec::new();
    for domain in config.domains() {
        for (keys, limit) in domain.key_paths() {
            let repeated = keys
                .iter()
                .enumerate()
                .find(|(i, k)| keys[..*i].contains(k))
                .map(|(_, k)| *k);
            if let Some(k) = repeated {
                out.push(format!(
                    "{}: no rate_limit_quota bucket reaches it: key {k:?} appears twice on its path, and a bucket id has each key once",
                    limit.full_key
                ));
                continue;
            }
            let mut sorted: Vec<Entry> = keys.iter().map(|k| Entry::new(*k, "")).collect();
            order.sort(&mut sorted);
            if sorted.iter().zip(&keys).any(|(e, k)| e.key != *k) {
                let want: Vec<&str> = sorted.iter().map(|e| e.key.as_str()).collect();
                out.push(format!(
                    "{}: no rate_limit_quota bucket reaches it: its keys are nested as {}, and a bucket's entries become a descriptor as {} (keys sorted bytewise after SLUICE_RLQS_KEY_ORDER)",
                    limit.full_key,
                    keys.join(" > "),
                    want.join(" > ")
                ));
            }
        }
    }
    out.sort();
    out
}

/// The service's settings (SLUICE_RLQS_*), and the caps it shares with ratelimit.v3.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RlqsOptions {
    /// SLUICE_RLQS_ASSIGNMENT_TTL_SECS: the shortest time to live of an assignment; it is
    /// lengthened to twice a stream's reporting interval when that is longer.
    pub ttl: Duration,
    /// SLUICE_RLQS_ABANDON_IDLE_SECS: a bucket an Envoy has reported no attempt for this long is
    /// abandoned.
    pub abandon_idle: Duration,
    /// SLUICE_RLQS_MAX_BYTES: the memory the buckets and holders may take.
    pub max_bytes: usize,
    pub key_order: KeyOrder,
    /// SHADOW_MODE: every bucket is allowed.
    pub shadow_mode: bool,
    /// SLUICE_MAX_ENTRIES and SLUICE_MAX_KEY_BYTES: a bucket id past either is refused as a
    /// request's descriptor would be.
    pub max_entries: usize,
    pub max_key_bytes: usize,
}

impl Default for RlqsOptions {
    fn default() -> Self {
        RlqsOptions {
            ttl: Duration::from_secs(10),
            abandon_idle: Duration::from_secs(300),
            max_bytes: 32 << 20,
            key_order: KeyOrder::default(),
            shadow_mode: false,
            max_entries: 32,
            max_key_bytes: 4096,
        }
    }
}

/// One bucket's usage in a report: its id (entries in any order) and the requests attempted
/// (allowed plus denied) since the Envoy's previous report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Usage {
    pub id: Vec<Entry>,
    pub attempted: u64,
}

/// What to send an Envoy about one bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Action {
    /// The bucket id as the Envoy sent it.
    pub id: Arc<[Entry]>,
    pub assignment: Assignment,
    /// Whole seconds (Envoy reads only the seconds); unused for [`Assignment::Abandon`].
    pub ttl_secs: u64,
}

/// Why a stream is ended.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StreamError {
    #[error("the first usage report of a stream must name its domain")]
    NoDomain,
    #[error("a stream reports for one domain: it began with {first:?}, then named {then:?}")]
    DomainChanged { first: String, then: String },
}

/// The service's counters, for `/metrics` and `/stats`.
#[derive(Debug, Default)]
pub struct RlqsCounters {
    pub reports: AtomicU64,
    pub assignments: AtomicU64,
    pub pushed: AtomicU64,
    pub malformed: AtomicU64,
    pub refused: AtomicU64,
    pub abandoned: AtomicU64,
    pub expired: AtomicU64,
    /// Syncs with a bucket's owner on another node that failed (PEERS).
    pub sync_failures: AtomicU64,
}

/// A stream's reporting interval until two reports measure it: Envoy 1.39 reports every 5 s
/// whatever its `reporting_interval` says, so a first assignment lives at least 10 s and does not
/// expire before the second report.
pub(crate) const ASSUMED_INTERVAL_US: u64 = 5_000_000;

/// What a stream is told to do about one of its buckets when it is not reporting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Push {
    /// Its current part changed.
    Current,
    Abandon,
}

/// The part of a stream other streams' reports and the sweep reach: what to push to it.
#[derive(Debug, Default)]
struct Outbox {
    /// The bucket ids it holds a part of, with their bucket's key.
    held: Mutex<HashMap<Arc<[Entry]>, Box<str>>>,
    /// What to push, one entry per bucket id (a newer push replaces an older one).
    pending: Mutex<HashMap<Arc<[Entry]>, Push>>,
    wake: tokio::sync::Notify,
}

/// The buckets and the streams of this node.
pub struct RlqsService {
    config: ConfigHandle,
    clock: Arc<dyn Clock>,
    options: RlqsOptions,
    buckets: DashMap<Box<str>, Bucket, foldhash::fast::RandomState>,
    streams: DashMap<u64, Arc<Outbox>, foldhash::fast::RandomState>,
    next_stream: AtomicU64,
    bytes: AtomicUsize,
    pub counters: RlqsCounters,
    /// With PEERS: who owns each bucket, and how to reach it ([`remote`]).
    peers: Option<Arc<dyn RlqsPeers>>,
    /// Wakes the sync task at once (a new holder of a bucket another node owns).
    sync_now: tokio::sync::Notify,
    /// Set when the app stops: every stream ends, so Envoys reconnect to another replica and
    /// the drain does not wait for streams that never end on their own.
    closing: tokio::sync::watch::Sender<bool>,
}

impl RlqsService {
    pub fn new(config: ConfigHandle, clock: Arc<dyn Clock>, options: RlqsOptions) -> Self {
        // Streams are numbered from the start time, so a restarted node's streams are not taken
        // for its previous life's by an owner that still holds those until they expire.
        let first_stream = clock.now().micros();
        RlqsService {
            config,
            clock,
            options,
            buckets: DashMap::default(),
            streams: DashMap::default(),
            next_stream: AtomicU64::new(first_stream),
            bytes: AtomicUsize::new(0),
            counters: RlqsCounters::default(),
            peers: None,
            sync_now: tokio::sync::Notify::new(),
            closing: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Ends every stream, now and from now on (the app is stopping).
    pub(crate) fn close_streams(&self) {
        self.closing.send_replace(true);
    }

    /// Splits buckets across the peers: each bucket's owner on the ring splits it across every
    /// node's Envoys, and this node syncs its Envoys of the buckets others own ([`remote`]).
    pub(crate) fn with_peers(mut self, peers: Arc<dyn RlqsPeers>) -> Self {
        self.peers = Some(peers);
        self
    }

    /// Whether another node owns the bucket at `key` (never without peers).
    fn owned_elsewhere(&self, key: &str) -> bool {
        self.peers.as_ref().is_some_and(|p| p.owner(key).is_some())
    }

    /// Splits `bucket` among its holders as its owner: its whole rate, or while this node
    /// reaches no majority of its peers only what it may split alone ([`Rate::alone`]), since
    /// the other side of the partition goes on splitting the whole rate.
    fn split(&self, bucket: &mut Bucket) -> Vec<usize> {
        match self.peers.as_ref().and_then(|p| p.alone()) {
            Some(peers) => {
                let cap = bucket.rate.alone(peers);
                bucket.split_within(cap)
            }
            None => bucket.split(),
        }
    }

    pub fn options(&self) -> &RlqsOptions {
        &self.options
    }

    /// A new stream; it closes when the returned value is dropped.
    pub fn open(self: &Arc<Self>) -> RlqsStream {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let outbox = Arc::new(Outbox::default());
        self.streams.insert(id, outbox.clone());
        RlqsStream {
            service: self.clone(),
            id,
            outbox,
            domain: None,
            last_report_us: None,
            interval_us: ASSUMED_INTERVAL_US,
        }
    }

    fn now_us(&self) -> u64 {
        self.clock.now().micros()
    }

    /// Charges `bytes` against SLUICE_RLQS_MAX_BYTES; false (nothing charged) past it.
    fn charge(&self, bytes: usize) -> bool {
        self.bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                b.checked_add(bytes)
                    .filter(|&n| n <= self.options.max_bytes)
            })
            .is_ok()
    }

    fn release(&self, bytes: usize) {
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Tells `stream` to push `push` for bucket `id`.
    fn push(&self, stream: u64, id: Arc<[Entry]>, push: Push) {
        if let Some(outbox) = self.streams.get(&stream) {
            lock(&outbox.pending).insert(id, push);
            outbox.wake.notify_one();
        }
    }

    /// The bucket at `key`, inserted (and charged) with `rate` if new; `None` past
    /// SLUICE_RLQS_MAX_BYTES.
    fn bucket_mut(
        &self,
        key: &str,
        rate: Rate,
    ) -> Option<dashmap::mapref::one::RefMut<'_, Box<str>, Bucket>> {
        let mut bucket = match self.buckets.get_mut(key) {
            Some(b) => b,
            // Charged only by the call that inserts it.
            None => match self.buckets.entry(key.into()) {
                dashmap::Entry::Occupied(e) => e.into_ref(),
                dashmap::Entry::Vacant(v) => {
                    if !self.charge(BUCKET_CHARGE + key.len()) {
                        return None;
                    }
                    v.insert(Bucket::new(rate))
                }
            },
        };
        bucket.set_rate(rate);
        Some(bucket)
    }

    /// What `stream`'s part of the bucket at `key` is, after counting its report of
    /// `attempted` requests. On a bucket this node owns the split runs again when due
    /// ([`Bucket::split_due`]: a new holder, or a part of a round of reports since the last) and
    /// the other holders of this node whose parts changed are told to push theirs; on a bucket
    /// another node owns the part is the owner's last answer ([`remote`]).
    fn hold(
        &self,
        (stream, ttl_secs): (u64, u64),
        (key, id): (&str, &Arc<[Entry]>),
        rate: Rate,
        attempted: u64,
    ) -> Held {
        let now = self.now_us();
        let remote = self.owned_elsewhere(key);
        let Some(mut bucket) = self.bucket_mut(key, rate) else {
            return Held::Refused;
        };
        let mut due = true;
        let at = match bucket.position(None, stream, id) {
            Some(at) => {
                bucket.holders[at].report(attempted, now);
                due = bucket.split_due();
                at
            }
            // A new holder's first report starts its first sample: what it counts happened
            // before (the request that made Envoy create the bucket, or a previous stream's).
            None => {
                if !self.charge(holder_charge(id)) {
                    return Held::Refused;
                }
                let mut holder = Holder::new(stream, id.clone(), now);
                holder.confirmed = !remote;
                bucket.holders.reserve_exact(1);
                bucket.holders.push(holder);
                bucket.holders.len() - 1
            }
        };
        bucket.holders[at].expires_us = now + ttl_secs * 1_000_000;
        if remote {
            let h = &bucket.holders[at];
            if !h.confirmed {
                self.sync_now.notify_one();
                return Held::Pending;
            }
            return Held::Assigned(bucket.rate.assignment(h.assigned));
        }
        if !due {
            return Held::Assigned(bucket.rate.assignment(bucket.holders[at].assigned));
        }
        let changed = self.split(&mut bucket);
        let assignment = bucket.rate.assignment(bucket.holders[at].assigned);
        let others = local_holders(&bucket, changed.into_iter().filter(|&i| i != at));
        drop(bucket);
        for (s, id) in others {
            self.push(s, id, Push::Current);
        }
        Held::Assigned(assignment)
    }

    /// Removes `stream`'s part of the bucket at `key`, if any (the bucket's rule changed to a
    /// blanket one).
    fn drop_holder(&self, stream: u64, key: &str, id: &[Entry]) {
        if let Some(mut bucket) = self.buckets.get_mut(key)
            && let Some(at) = bucket.position(None, stream, id)
        {
            bucket.holders.swap_remove(at);
            self.release(holder_charge(id));
        }
    }

    /// `stream`'s current assignment for bucket `id` held at `key` (a push), refreshing its
    /// time to live.
    fn current(&self, stream: u64, key: &str, id: &[Entry], ttl_secs: u64) -> Option<Assignment> {
        let mut bucket = self.buckets.get_mut(key)?;
        let at = bucket.position(None, stream, id)?;
        let now = self.now_us();
        let holder = &mut bucket.holders[at];
        holder.expires_us = now + ttl_secs * 1_000_000;
        let assigned = holder.assigned;
        Some(bucket.rate.assignment(assigned))
    }

    /// A stream ended: its parts stay reserved until they expire.
    fn close(&self, stream: u64, outbox: &Outbox) {
        self.streams.remove(&stream);
        let held = std::mem::take(&mut *lock(&outbox.held));
        for (id, key) in held {
            if let Some(mut bucket) = self.buckets.get_mut(&key)
                && let Some(at) = bucket.position(None, stream, &id)
            {
                bucket.holders[at].gone = true;
            }
        }
    }

    /// Frees expired parts and abandons quiet buckets; the holders whose parts grew are told to
    /// push them. Run every second by the app.
    pub fn sweep(&self) {
        let now = self.now_us();
        let idle = u64::try_from(self.options.abandon_idle.as_micros()).unwrap_or(u64::MAX);
        let quiet_before = now.saturating_sub(idle);
        let mut pushes = Vec::new();
        let mut freed = 0usize;
        self.buckets.retain(|key, bucket| {
            let before: Vec<usize> = bucket
                .holders
                .iter()
                .map(|h| holder_charge(&h.id))
                .collect();
            let (expired, quiet) = bucket.remove_stale(now, quiet_before);
            if expired == 0 && quiet.is_empty() {
                if bucket.holders.is_empty() {
                    // Its last holder was dropped by a report (its rule became a blanket one).
                    freed += BUCKET_CHARGE + key.len();
                    return false;
                }
                return true;
            }
            self.counters
                .expired
                .fetch_add(expired as u64, Ordering::Relaxed);
            let after: usize = bucket.holders.iter().map(|h| holder_charge(&h.id)).sum();
            freed += before.iter().sum::<usize>() - after;
            for h in quiet {
                pushes.push((h.stream, h.id, Push::Abandon));
            }
            // A bucket another node owns is split there; its answer comes with the next sync.
            if !self.owned_elsewhere(key) {
                let changed = self.split(bucket);
                for (s, id) in local_holders(bucket, changed.into_iter()) {
                    pushes.push((s, id, Push::Current));
                }
            }
            if bucket.holders.is_empty() {
                freed += BUCKET_CHARGE + key.len();
                return false;
            }
            true
        });
        self.release(freed);
        for (stream, id, push) in pushes {
            if push == Push::Abandon {
                if let Some(outbox) = self.streams.get(&stream) {
                    lock(&outbox.held).remove(&id);
                }
                self.counters.abandoned.fetch_add(1, Ordering::Relaxed);
            }
            self.push(stream, id, push);
        }
    }

    /// The numbers for `/metrics`: streams, buckets, holders, bytes.
    pub fn gauges(&self) -> RlqsTables {
        let mut holders = 0;
        for b in self.buckets.iter() {
            holders += b.holders.len();
        }
        RlqsTables {
            streams: self.streams.len(),
            buckets: self.buckets.len(),
            holders,
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }

    /// The `n` buckets with the highest demand: (key, demand and assigned requests per second,
    /// holders), for `/metrics` and `/debug/rlqs`.
    pub fn top(&self, n: usize) -> Vec<BucketView> {
        // Demand only, then the views of the busiest: a scrape walks every bucket once and
        // copies only what it shows.
        let mut all: Vec<(f64, Box<str>)> = self
            .buckets
            .iter()
            .map(|b| (b.demand(), b.key().clone()))
            .collect();
        let busiest = |a: &(f64, Box<str>), b: &(f64, Box<str>)| {
            b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1))
        };
        if all.len() > n && n > 0 {
            all.select_nth_unstable_by(n - 1, busiest);
        }
        all.truncate(n);
        all.sort_by(busiest);
        all.iter().filter_map(|(_, key)| self.bucket(key)).collect()
    }

    /// One bucket by its key (`domain_key_value_...`), for `/debug/rlqs?key=`.
    pub fn bucket(&self, key: &str) -> Option<BucketView> {
        self.buckets.get(key).map(|b| BucketView::of(key, &b))
    }
}

/// Table sizes, for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RlqsTables {
    pub streams: usize,
    pub buckets: usize,
    pub holders: usize,
    pub bytes: usize,
}

/// One bucket as `/debug/rlqs` shows it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct BucketView {
    pub key: String,
    /// The whole limit, requests per second, and its burst.
    pub rate: f64,
    pub burst: u64,
    /// Attempted requests per second, over the live holders.
    pub demand: f64,
    /// Assigned requests per second, gone holders included.
    pub assigned: f64,
    pub holders: Vec<HolderView>,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct HolderView {
    pub stream: u64,
    pub demand: Option<f64>,
    pub assigned: f64,
    pub expires_unix_ms: u64,
    pub gone: bool,
}

impl BucketView {
    fn of(key: &str, b: &Bucket) -> Self {
        BucketView {
            key: key.to_owned(),
            rate: b.rate.per_sec(b.rate.tokens),
            burst: b.rate.burst,
            demand: b.demand(),
            assigned: b.rate.per_sec(b.assigned()),
            holders: b
                .holders
                .iter()
                .map(|h| HolderView {
                    stream: h.stream,
                    demand: h.demand,
                    assigned: b.rate.per_sec(h.assigned),
                    expires_unix_ms: h.expires_us / 1_000,
                    gone: h.gone,
                })
                .collect(),
        }
    }
}

/// What a report's bucket gets from [`RlqsService::hold`].
enum Held {
    Assigned(Assignment),
    /// A new holder of a bucket another node owns: nothing until the owner answers (pushed).
    Pending,
    /// Past SLUICE_RLQS_MAX_BYTES.
    Refused,
}

/// The streams and bucket ids of this node's holders among `which`, to push their parts to.
fn local_holders(bucket: &Bucket, which: impl Iterator<Item = usize>) -> Vec<(u64, Arc<[Entry]>)> {
    which
        .map(|i| &bucket.holders[i])
        .filter(|h| h.node.is_none())
        .map(|h| (h.stream, h.id.clone()))
        .collect()
}

fn holder_charge(id: &[Entry]) -> usize {
    HOLDER_CHARGE
        + id.iter()
            .map(|e| e.key.len() + e.value.len() + ENTRY_CHARGE)
            .sum::<usize>()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means another stream's task panicked; the map is still whole.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One Envoy's stream: its domain, its reporting interval, and its outbox. Dropping it closes
/// the stream (its parts stay reserved until they expire).
pub struct RlqsStream {
    service: Arc<RlqsService>,
    id: u64,
    outbox: Arc<Outbox>,
    domain: Option<String>,
    last_report_us: Option<u64>,
    /// The time between its last two reports ([`ASSUMED_INTERVAL_US`] until known).
    interval_us: u64,
}

impl Drop for RlqsStream {
    fn drop(&mut self) {
        self.service.close(self.id, &self.outbox);
    }
}

impl RlqsStream {
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn domain(&self) -> Option<&str> {
        self.domain.as_deref()
    }

    /// Resolves when something is waiting in [`RlqsStream::pending`].
    pub(crate) async fn woken(&self) {
        self.outbox.wake.notified().await;
    }

    /// Resolves when the service is closing its streams ([`RlqsService::close_streams`]).
    pub async fn closed(&self) {
        let mut closing = self.service.closing.subscribe();
        // An error means the service is gone: closed too.
        let _ = closing.wait_for(|&c| c).await;
    }

    /// The time to live of this stream's assignments: SLUICE_RLQS_ASSIGNMENT_TTL_SECS, or twice
    /// its reporting interval when that is longer, so an assignment outlives a late report.
    fn ttl_secs(&self) -> u64 {
        let base = self.service.options.ttl.as_secs().max(1);
        base.max((2 * self.interval_us).div_ceil(1_000_000))
    }

    /// Answers one usage report: an action for every well-formed bucket it names (a bucket id
    /// that is empty or past the caps is skipped and counted). Nothing when no config is loaded
    /// (Envoy keeps its `no_assignment_behavior`).
    pub fn report(&mut self, domain: &str, usages: Vec<Usage>) -> Result<Vec<Action>, StreamError> {
        self.check_domain(domain)?;
        let service = self.service.clone();
        service.counters.reports.fetch_add(1, Ordering::Relaxed);
        let now = service.now_us();
        if let Some(last) = self.last_report_us.replace(now) {
            let gap = now.saturating_sub(last);
            if gap >= bucket::MIN_SAMPLE_US {
                self.interval_us = gap;
            }
        }
        let Some(config) = service.config.current() else {
            return Ok(Vec::new());
        };
        let domain = config.domain(self.domain.as_deref().unwrap_or_default());
        let ttl_secs = self.ttl_secs();
        let mut actions = Vec::with_capacity(usages.len());
        let mut key = String::new();
        for mut usage in usages {
            if !self.well_formed(&usage.id) {
                service.counters.malformed.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            service.options.key_order.sort(&mut usage.id);
            let matched = domain.and_then(|d| d.lookup(&usage.id));
            let policy = Policy::of(
                matched.as_ref().map(|m| m.limit),
                service.options.shadow_mode,
            );
            key.clear();
            let shared = matched.as_ref().map_or(&[][..], |m| &m.shared_values[..]);
            let stream_domain = self.domain.as_deref().unwrap_or_default();
            write_bucket_key(&mut key, stream_domain, &usage.id, shared);
            let id: Arc<[Entry]> = usage.id.into();
            let assignment = match policy {
                Policy::AllowAll | Policy::DenyAll => {
                    service.drop_holder(self.id, &key, &id);
                    lock(&self.outbox.held).remove(&id);
                    if policy == Policy::AllowAll {
                        Assignment::AllowAll
                    } else {
                        Assignment::DenyAll
                    }
                }
                Policy::Split(rate) => {
                    match service.hold((self.id, ttl_secs), (&key, &id), rate, usage.attempted) {
                        Held::Assigned(a) => {
                            self.note_held(&id, &key);
                            a
                        }
                        Held::Pending => {
                            self.note_held(&id, &key);
                            continue;
                        }
                        Held::Refused => {
                            service.counters.refused.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                    }
                }
            };
            actions.push(Action {
                id,
                assignment,
                ttl_secs,
            });
        }
        service
            .counters
            .assignments
            .fetch_add(actions.len() as u64, Ordering::Relaxed);
        Ok(actions)
    }

    /// Records that this stream holds a part of the bucket at `key` for `id`; a report repeats
    /// it every interval, so the key is copied only the first time.
    fn note_held(&self, id: &Arc<[Entry]>, key: &str) {
        let mut held = lock(&self.outbox.held);
        if held.get(id).is_none_or(|k| **k != *key) {
            held.insert(id.clone(), key.into());
        }
    }

    fn check_domain(&mut self, domain: &str) -> Result<(), StreamError> {
        match &self.domain {
            None if domain.is_empty() => Err(StreamError::NoDomain),
            None => {
                self.domain = Some(domain.to_owned());
                Ok(())
            }
            Some(first) if !domain.is_empty() && domain != first => {
                Err(StreamError::DomainChanged {
                    first: first.clone(),
                    then: domain.to_owned(),
                })
            }
            Some(_) => Ok(()),
        }
    }

    /// A bucket id Sluice can map: not empty, no empty key, within SLUICE_MAX_ENTRIES and its
    /// counter key within SLUICE_MAX_KEY_BYTES.
    fn well_formed(&self, id: &[Entry]) -> bool {
        let o = &self.service.options;
        let domain = self.domain.as_deref().unwrap_or_default();
        !id.is_empty()
            && id.len() <= o.max_entries
            && id.iter().all(|e| !e.key.is_empty())
            && bucket_key_len(domain, id) <= o.max_key_bytes
    }

    /// What other streams' reports and the sweep changed for this stream: its new parts (each
    /// with a fresh time to live) and the buckets to abandon.
    pub fn pending(&mut self) -> Vec<Action> {
        let pending = std::mem::take(&mut *lock(&self.outbox.pending));
        let ttl_secs = self.ttl_secs();
        let mut actions = Vec::with_capacity(pending.len());
        for (id, push) in pending {
            let assignment = match push {
                Push::Abandon => Assignment::Abandon,
                Push::Current => {
                    let key = lock(&self.outbox.held).get(&id).cloned();
                    let current =
                        key.and_then(|k| self.service.current(self.id, &k, &id, ttl_secs));
                    let Some(a) = current else { continue };
                    a
                }
            };
            actions.push(Action {
                id,
                assignment,
                ttl_secs,
            });
        }
        self.service
            .counters
            .pushed
            .fetch_add(actions.len() as u64, Ordering::Relaxed);
        actions
    }
}

#[cfg(test)]
mod tests;
