//! The memcached store (BACKEND_TYPE=memcache): counters shared by every replica, and by
//! envoyproxy/ratelimit instances on the same memcached during a migration.
//!
//! **Fixed window** uses the Go service's keys byte for byte (`CACHE_KEY_PREFIX +
//! domain_k_v_..._<window start>`, the same as Redis's), on the server the Go client picks for
//! them ([`servers`]), with the Go service's writes: `incr key hits`, and for a key that does
//! not exist yet `add key` with the hits as its value and the window (plus a jitter below
//! EXPIRATION_JITTER_MAX_SECONDS) as its expiry, then `incr` again if another writer added it
//! first. Go reads the count first (`get`) and increments later, in the background, so
//! concurrent requests all read the same count and all pass: a limit of 10 admits as many
//! requests as arrive within one round trip. Sluice decides on the value `incr` returns, which
//! memcached computes atomically, so each request sees the count including every request
//! before it: exactly `limit` requests pass per window however many replicas call at once.
//!
//! **Sliding window, token and leaky buckets** keep one state word each (the memory store's,
//! [`crate::limiter::counter`]) as a decimal value, updated with `gets` and `cas`: the
//! decision is computed on the word read, written only if the word has not changed since
//! (`EXISTS` means another writer won: read again), `add` for a new key. No update is lost, so
//! they are exact too. Within one Sluice the updates of one key wait for each other (a lock
//! per key stripe), so `cas` only races other replicas; a call gives up after
//! [`MAX_CAS_ATTEMPTS`] lost races in a row.
//!
//! **Keys memcached cannot store** (longer than 250 bytes, or with a space or a control
//! character; a descriptor value can be anything) are stored as `sluice:` and the SHA-256 of
//! the key in hex ([`crate::key::memcached_key`]). The Go client refuses such keys, so Go
//! counts nothing for them (and a request holding one reads no counts at all): their limits
//! never apply under Go; under Sluice they do.
//!
//! **Expiry.** Every key is kept as long as it can change an answer: a fixed window's until
//! its window ends (plus the jitter, as in Go), a sliding window's until the window after it
//! ends, a bucket's until it is back at rest (for a leaky bucket, one emission interval after
//! nginx's excess is 0; a debt included). memcached's clock counts whole seconds, and a key
//! given `E` seconds can be dropped `E - 1` seconds and a moment after it was written, so each
//! expiry is one second more than that (the Go service's is not: its key of a window of a
//! second can be dropped within that second, and the count start again). memcached takes an
//! expiry above 30 days as a Unix time: the Go service's MONTH limits plus a jitter, and its
//! YEAR limits, expire at once. Sluice sends those as the time they end, so they last their
//! window.
//!
//! **Failures.** Each call is bounded by SLUICE_MEMCACHE_TIMEOUT_MS; an error is a
//! [`StoreError::Backend`], answered UNKNOWN or OK as the domain's failure mode says (the Go
//! service logs memcache errors and answers OK). A server found down fails its calls at once
//! until a probe gets an answer ([`servers`]); `/healthcheck` is healthy once every server of
//! the start-up list has answered (the Go service's memcache backend never reports healthy).

pub mod protocol;
pub(crate) mod servers;
pub mod srv;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use self::protocol::{Batch, Reply};
use self::servers::{Options, Server, ServerList};
use super::breaker::BreakerSettings;
use super::go_fixed::{self, Jitter, OverLimitCache};
use super::penalty::{self, Penalized};
use super::{CounterStore, Hit, StoreError};
use crate::clock::Timestamp;
use crate::key::{memcached_key, remote_key};
use crate::limiter::{Algorithm, Decision, Quota, bucket, counter};
use crate::tls::ClientTls;

pub(crate) use self::servers::split_host_port;

/// Lost `cas` races in a row after which a call fails (its deadline may end it sooner).
pub(crate) const MAX_CAS_ATTEMPTS: usize = 64;
/// After a second lost race in a row a call waits up to this long, at random, so that replicas
/// that keep meeting on one key fall out of step instead of one of them losing every time.
const CAS_BACKOFF_MAX_MS: u64 = 3;
/// Lock stripes for one Sluice's `cas` updates.
const CAS_STRIPES: usize = 256;
/// memcached's longest relative expiry: anything above is a Unix time.
const MAX_RELATIVE_EXPIRY: u64 = 60 * 60 * 24 * 30;

/// Where the servers come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemcacheServers {
    /// MEMCACHE_HOST_PORT: `host:port` or socket paths, in the order that spreads keys.
    List(Vec<String>),
    /// MEMCACHE_SRV, re-resolved every MEMCACHE_SRV_REFRESH (never when `None`).
    Srv {
        name: String,
        refresh: Option<Duration>,
        /// SLUICE_MEMCACHE_SRV_RESOLVER; `None`: /etc/resolv.conf's nameservers.
        resolver: Option<SocketAddr>,
    },
}

/// MEMCACHE_TLS's files, read and checked at start-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemcacheTls {
    pub client: ClientTls,
    /// MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION: the chain is verified, the name is not.
    pub skip_hostname_verification: bool,
}

/// The memcache backend's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemcacheConfig {
    pub servers: MemcacheServers,
    /// MEMCACHE_MAX_IDLE_CONNS: the connections kept per server, each carrying many calls.
    pub conns: usize,
    /// SLUICE_MEMCACHE_MAX_PENDING: calls in flight per server.
    pub max_pending: usize,
    /// SLUICE_MEMCACHE_TIMEOUT_MS.
    pub timeout: Duration,
    pub expiration_jitter_max_seconds: u64,
    pub local_cache_size_in_bytes: u64,
    /// SLUICE_LOCAL_CACHE_MAX_AGE_MS: how long an over-limit entry is trusted.
    pub local_cache_max_age: Duration,
    pub stop_cache_key_increment_when_overlimit: bool,
    /// SLUICE_MEMCACHE_PROBE_INTERVAL_MS and SLUICE_MEMCACHE_BREAKER_TIMEOUTS.
    pub breaker: BreakerSettings,
    pub tls: Option<MemcacheTls>,
}

/// The expiry to send for a key that must last `ttl_secs` from `now`: one second more, as
/// memcached's clock counts whole seconds and drops a key given `E` seconds once it has ticked
/// `E` times, which can be `E - 1` seconds and a moment after the write; relative up to 30
/// days, else the Unix time it ends.
fn exptime(ttl_secs: u64, now: Timestamp) -> u64 {
    let ttl = ttl_secs.saturating_add(1);
    if ttl > MAX_RELATIVE_EXPIRY {
        now.secs().saturating_add(ttl)
    } else {
        ttl
    }
}

fn backend(message: String) -> StoreError {
    StoreError::Backend { message }
}

fn bad_reply(server: &Server, reply: Option<&Reply>) -> StoreError {
    backend(format!(
        "memcached {}: unexpected reply {reply:?}",
        server.addr
    ))
}

/// One fixed-window key to count on one server.
struct Count {
    /// The hit's index in the request.
    hit: usize,
    key: String,
    by: u64,
    /// Whether a missing key is created (not for a peek, nor a hit STOP_... holds back).
    create: bool,
    exptime: u64,
}

/// The memcached counter store.
pub struct MemcacheStore {
    servers: Arc<ServerList>,
    jitter: Jitter,
    stop_when_over: bool,
    local_cache: Option<OverLimitCache>,
    stripes: Box<[tokio::sync::Mutex<()>]>,
    stripe_seed: foldhash::fast::RandomState,
    refresh: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for MemcacheStore {
    fn drop(&mut self) {
        if let Some(t) = &self.refresh {
            t.abort();
        }
    }
}

impl MemcacheStore {
    /// Finds the servers (an SRV lookup fails start-up, as in Go) and starts connecting in the
    /// background. Must be called inside a tokio runtime.
    pub async fn start(config: &MemcacheConfig) -> Result<Self, StoreError> {
        let tls = match &config.tls {
            None => None,
            Some(t) => Some(tls_connector(t)?),
        };
        let options = Options {
            timeout: config.timeout,
            conns: config.conns,
            max_pending: config.max_pending,
            breaker: config.breaker,
            tls,
        };
        let (addrs, refresh) = match &config.servers {
            MemcacheServers::List(addrs) => (addrs.clone(), None),
            MemcacheServers::Srv {
                name,
                refresh,
                resolver,
            } => {
                let found = srv_servers(name, *resolver).await.map_err(|e| {
                    backend(format!(
                        "MEMCACHE_SRV={name}: unable to fetch servers from SRV: {e}"
                    ))
                })?;
                (found, refresh.map(|every| (name.clone(), every, *resolver)))
            }
        };
        let servers = ServerList::start(addrs, options);
        let refresh = refresh.map(|(name, every, resolver)| {
            let list = Arc::downgrade(&servers);
            tokio::spawn(refresh_servers(list, name, every, resolver))
        });
        Ok(MemcacheStore {
            servers,
            jitter: Jitter::new(config.expiration_jitter_max_seconds),
            stop_when_over: config.stop_cache_key_increment_when_overlimit,
            local_cache: OverLimitCache::new(
                config.local_cache_size_in_bytes,
                config.local_cache_max_age,
            ),
            stripes: (0..CAS_STRIPES)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            stripe_seed: foldhash::fast::RandomState::default(),
            refresh,
        })
    }

    /// True once every server of the start-up list has answered.
    pub fn is_ready(&self) -> bool {
        self.servers.is_ready()
    }

    /// [`MemcacheStore::is_ready`], pushed at the instant it changes.
    pub fn ready_changes(&self) -> tokio::sync::watch::Receiver<bool> {
        self.servers.ready_changes()
    }

    /// Each server's address and breaker.
    pub fn breakers(&self) -> Vec<(String, super::redis::BreakerStats)> {
        self.servers
            .servers()
            .iter()
            .map(|s| (s.addr.clone(), s.stats()))
            .collect()
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.servers.timeout()
    }

    /// The key memcached holds a hit's counter under.
    fn key(hit: &Hit<'_>, now: Timestamp) -> String {
        memcached_key(remote_key(hit.key, &hit.quota, now))
    }

    async fn apply_now(
        &self,
        now: Timestamp,
        hits: &[Hit<'_>],
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        let deadline = self.deadline();
        let mut decisions = go_fixed::cached_decisions(self.local_cache.as_ref(), now, hits);
        // What the cache answered is not remembered again (its age runs from when memcached
        // found the key over).
        let cached: Vec<bool> = decisions.iter().map(Option::is_some).collect();
        let increment = match go_fixed::increments_without_reading(self.stop_when_over, &decisions)
        {
            Some(all) => vec![all; hits.len()],
            None => {
                let counts = self.read_counts(now, hits, deadline).await?;
                go_fixed::increments_from_counts(hits, &counts)
            }
        };
        let pending = |fixed: bool| {
            (0..hits.len())
                .filter(|&i| decisions[i].is_none())
                .filter(|&i| (hits[i].quota.algorithm == Algorithm::FixedWindow) == fixed)
                .collect::<Vec<usize>>()
        };
        let (fixed, others) = (pending(true), pending(false));
        let (counted, updated) = futures_util::future::join(
            self.count_fixed(now, hits, &fixed, &increment, deadline),
            async {
                let mut updated = Vec::with_capacity(others.len());
                for &i in &others {
                    updated.push((i, self.update(&hits[i], now, deadline).await?));
                }
                Ok::<_, StoreError>(updated)
            },
        )
        .await;
        for (i, d) in counted?.into_iter().chain(updated?) {
            decisions[i] = Some(d);
        }
        for ((hit, d), cached) in hits.iter().zip(&decisions).zip(cached) {
            let Some(d) = d else {
                return Err(StoreError::BadReply {
                    expected: hits.len(),
                    got: out.len(),
                });
            };
            if !cached {
                go_fixed::remember_if_over(self.local_cache.as_ref(), now, hit, d);
            }
            out.push(*d);
        }
        Ok(())
    }

    /// For STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: each fixed-window hit's count now (`None`
    /// for the other algorithms), one `get` per server.
    async fn read_counts(
        &self,
        now: Timestamp,
        hits: &[Hit<'_>],
        deadline: Instant,
    ) -> Result<Vec<Option<u64>>, StoreError> {
        let mut counts = vec![None; hits.len()];
        let fixed = hits
            .iter()
            .enumerate()
            .filter(|(_, h)| h.quota.algorithm == Algorithm::FixedWindow);
        let mut groups: Groups<(usize, String)> = Vec::new();
        for (i, hit) in fixed {
            let key = Self::key(hit, now);
            group(&mut groups, self.servers.pick(&key)?, (i, key));
        }
        let replies = futures_util::future::join_all(groups.iter().map(|(server, keys)| {
            let mut batch = Batch::default();
            let names: Vec<&str> = keys.iter().map(|(_, k)| k.as_str()).collect();
            batch.get(&names);
            async move { server.call(batch, deadline).await }
        }))
        .await;
        for ((server, keys), reply) in groups.iter().zip(replies) {
            let reply = reply?;
            let Some(Reply::Values(items)) = reply.first() else {
                return Err(bad_reply(server, reply.first()));
            };
            for (i, key) in keys {
                let found = items.iter().find(|it| &it.key == key);
                let count = found.and_then(|it| it.number()).unwrap_or(0);
                counts[*i] = Some(u64::try_from(count).unwrap_or(u64::MAX));
            }
        }
        Ok(counts)
    }

    /// Counts the fixed-window hits `which`: per server, concurrently.
    async fn count_fixed(
        &self,
        now: Timestamp,
        hits: &[Hit<'_>],
        which: &[usize],
        increment: &[bool],
        deadline: Instant,
    ) -> Result<Vec<(usize, Decision)>, StoreError> {
        let mut groups: Groups<Count> = Vec::new();
        for &i in which {
            let hit = &hits[i];
            let key = Self::key(hit, now);
            let by = if go_fixed::increments(hit, increment[i]) {
                hit.hits
            } else {
                0
            };
            let ttl = self.jitter.ttl_secs(&key, hit.quota.window(), now);
            let count = Count {
                hit: i,
                create: by > 0,
                by,
                exptime: exptime(ttl, now),
                key,
            };
            group(&mut groups, self.servers.pick(&count.key)?, count);
        }
        let counted = futures_util::future::join_all(
            groups
                .iter()
                .map(|(server, counts)| count_on(server, counts, deadline)),
        )
        .await;
        let mut out = Vec::with_capacity(which.len());
        for ((_, counts), after) in groups.iter().zip(counted) {
            for (c, after) in counts.iter().zip(after?) {
                out.push((c.hit, go_fixed::counted(&hits[c.hit], now, after)));
            }
        }
        Ok(out)
    }

    /// The lock stripe of `key`: one Sluice's `cas` updates of a key wait for each other.
    fn stripe(&self, key: &str) -> &tokio::sync::Mutex<()> {
        use std::hash::BuildHasher;
        let i = self.stripe_seed.hash_one(key) as usize % self.stripes.len();
        &self.stripes[i]
    }

    /// Reads `key`'s state word (kept for `quota`, [`value_of`]), computes `f` on it (absent:
    /// `None`), and when `f` asks for a write stores its word with `cas` (`add` for a new key),
    /// reading again after a lost race.
    async fn read_modify_write<T>(
        &self,
        key: &str,
        quota: &Quota,
        deadline: Instant,
        f: impl Fn(Option<u128>) -> (T, Option<(u128, u64)>),
    ) -> Result<T, StoreError> {
        let server = self.servers.pick(key)?;
        let Ok(_turn) = tokio::time::timeout_at(deadline, self.stripe(key).lock()).await else {
            return Err(backend(format!(
                "memcached {}: {key} is busy: earlier updates of it did not finish within {:?} \
                 (SLUICE_MEMCACHE_TIMEOUT_MS)",
                server.addr,
                self.servers.timeout()
            )));
        };
        for attempt in 0..MAX_CAS_ATTEMPTS {
            if attempt >= 2 {
                use std::hash::BuildHasher;
                let salt = (key, attempt, Instant::now());
                let ms = self.stripe_seed.hash_one(salt) % (CAS_BACKOFF_MAX_MS + 1);
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            let mut read = Batch::default();
            read.gets(key);
            let reply = server.call(read, deadline).await?;
            let Some(Reply::Values(items)) = reply.first() else {
                return Err(bad_reply(&server, reply.first()));
            };
            let item = items.iter().find(|it| it.key == key);
            let word = match item {
                None => None,
                Some(it) => Some(word_of(quota, &it.value).ok_or_else(|| {
                    backend(format!(
                        "memcached {}: {key} holds {:?}, not a counter",
                        server.addr,
                        String::from_utf8_lossy(&it.value)
                    ))
                })?),
            };
            let (out, write) = f(word);
            let Some((next, exptime)) = write else {
                return Ok(out);
            };
            let mut store = Batch::default();
            let value = value_of(quota, next);
            match item.and_then(|it| it.cas) {
                Some(unique) => store.cas(key, &value, exptime, unique),
                None => store.add(key, &value, exptime),
            }
            let reply = server.call(store, deadline).await?;
            match reply.first() {
                Some(Reply::Stored) => return Ok(out),
                Some(Reply::Exists | Reply::NotFound | Reply::NotStored) => {}
                other => return Err(bad_reply(&server, other)),
            }
        }
        Err(backend(format!(
            "memcached {}: {key} changed under {MAX_CAS_ATTEMPTS} updates in a row (other \
             replicas writing it at once; the lock of one Sluice's own updates is per key stripe)",
            server.addr
        )))
    }

    /// The expiry of a state word written at `now`, for as long as it can change an answer:
    /// a sliding window's until the window after it ends (at most two windows; plus the
    /// jitter's most), a bucket's until it is back at rest.
    fn state_exptime(&self, quota: &Quota, word: u128, now: Timestamp) -> u64 {
        let ttl = match quota.algorithm {
            Algorithm::SlidingWindow => 2 * quota.window().max_secs() + self.jitter.max_secs,
            _ => bucket::rest_micros(word)
                .saturating_sub(now.micros())
                .div_ceil(1_000_000),
        };
        exptime(ttl, now)
    }

    /// A sliding window's or a bucket's hit: its word read, decided on and written back.
    async fn update(
        &self,
        hit: &Hit<'_>,
        now: Timestamp,
        deadline: Instant,
    ) -> Result<Decision, StoreError> {
        let q = hit.quota;
        let key = Self::key(hit, now);
        self.read_modify_write(&key, &q, deadline, |word| {
            let before = word.unwrap_or(0);
            let (d, next) = counter::decide(&q, before, now, hit.hits);
            let write =
                (hit.hits > 0 && next != before).then(|| (next, self.state_exptime(&q, next, now)));
            (d, write)
        })
        .await
    }

    /// Takes each hit's `hits` off its counter and answers a peek at what is left: a fixed
    /// window by `decr` (memcached floors it at 0, and a missing key stays missing), one call
    /// per server; the others by `gets` and `cas`. A refunded fixed-window key is forgotten by
    /// the local over-limit cache at once.
    async fn refund_now(
        &self,
        now: Timestamp,
        hits: &[Hit<'_>],
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        let deadline = self.deadline();
        let mut decisions: Vec<Option<Decision>> = vec![None; hits.len()];
        let mut groups: Groups<(usize, String)> = Vec::new();
        for (i, hit) in hits.iter().enumerate() {
            if hit.quota.algorithm == Algorithm::FixedWindow {
                let key = Self::key(hit, now);
                group(&mut groups, self.servers.pick(&key)?, (i, key));
            }
        }
        let (lefts, updated) = futures_util::future::join(
            futures_util::future::join_all(
                groups
                    .iter()
                    .map(|(server, keys)| decrement_on(server, hits, keys, deadline)),
            ),
            async {
                let mut updated = Vec::new();
                for (i, hit) in hits.iter().enumerate() {
                    if hit.quota.algorithm != Algorithm::FixedWindow {
                        updated.push((i, self.give_back(hit, now, deadline).await?));
                    }
                }
                Ok::<_, StoreError>(updated)
            },
        )
        .await;
        for left in lefts {
            for (i, left) in left? {
                let peek = Hit { hits: 0, ..hits[i] };
                decisions[i] = Some(go_fixed::counted(&peek, now, left));
            }
        }
        for (i, d) in updated? {
            decisions[i] = Some(d);
        }
        go_fixed::forget_refunded(self.local_cache.as_ref(), now, hits);
        go_fixed::push_all(hits.len(), decisions, out)
    }

    /// A sliding window's or a bucket's refund: its word read, `hits` taken off and written
    /// back; a peek at what is left.
    async fn give_back(
        &self,
        hit: &Hit<'_>,
        now: Timestamp,
        deadline: Instant,
    ) -> Result<Decision, StoreError> {
        let q = hit.quota;
        let key = Self::key(hit, now);
        self.read_modify_write(&key, &q, deadline, |word| {
            let before = word.unwrap_or(0);
            let next = counter::refund(&q, before, now, hit.hits);
            let peek = counter::decide(&q, next, now, 0).0;
            let write = word
                .filter(|w| next != *w)
                .map(|_| (next, self.state_exptime(&q, next, now)));
            (peek, write)
        })
        .await
    }

    /// Deletes each hit's key (a fixed window's for the current window: the Go service's key,
    /// so a Go instance on the same memcached sees the reset too) and forgets it in the local
    /// over-limit cache.
    async fn reset_now(&self, now: Timestamp, hits: &[Hit<'_>]) -> Result<(), StoreError> {
        let deadline = self.deadline();
        for hit in hits {
            let key = Self::key(hit, now);
            if let Some(cache) = &self.local_cache {
                cache.forget(&key);
            }
            let server = self.servers.pick(&key)?;
            let mut batch = Batch::default();
            batch.delete(&key);
            let reply = server.call(batch, deadline).await?;
            if !matches!(reply.first(), Some(Reply::Deleted | Reply::NotFound)) {
                return Err(bad_reply(&server, reply.first()));
            }
        }
        Ok(())
    }
}

/// The value a state word of `quota` is kept as: a bucket's time as text (the Redis store's,
/// [`bucket::text`]: µs and a fraction of one, readable as a number), any other word in
/// decimal.
fn value_of(quota: &Quota, word: u128) -> String {
    match quota.algorithm {
        Algorithm::TokenBucket | Algorithm::LeakyBucket => bucket::text(quota, word),
        _ => word.to_string(),
    }
}

/// The state word a value holds ([`value_of`]); `None` if it holds none.
fn word_of(quota: &Quota, value: &[u8]) -> Option<u128> {
    let text = std::str::from_utf8(value).ok()?.trim();
    match quota.algorithm {
        Algorithm::TokenBucket | Algorithm::LeakyBucket => bucket::parse(quota, text),
        _ => text.parse().ok(),
    }
}

/// Items of one request grouped by the server they go to.
type Groups<T> = Vec<(Arc<Server>, Vec<T>)>;

/// Adds `item` to `server`'s group.
fn group<T>(groups: &mut Groups<T>, server: Arc<Server>, item: T) {
    match groups.iter_mut().find(|(s, _)| Arc::ptr_eq(s, &server)) {
        Some((_, items)) => items.push(item),
        None => groups.push((server, vec![item])),
    }
}

/// The Go service's counting on one server, in at most three round trips: `incr` every key;
/// `add` the ones missing; `incr` again the ones another writer added in between. The count
/// each key holds once its hits are added, in order (a key repeated in the batch answers each
/// time the count its hits so far left).
async fn count_on(
    server: &Server,
    counts: &[Count],
    deadline: Instant,
) -> Result<Vec<u64>, StoreError> {
    let number = |reply: Option<&Reply>| match reply {
        Some(Reply::Number(n)) => Ok(Some(*n)),
        Some(Reply::NotFound) => Ok(None),
        other => Err(bad_reply(server, other)),
    };
    let mut batch = Batch::default();
    for c in counts {
        batch.incr(&c.key, c.by);
    }
    let replies = server.call(batch, deadline).await?;
    let mut after: Vec<Option<u64>> = Vec::with_capacity(counts.len());
    for i in 0..counts.len() {
        after.push(number(replies.get(i))?);
    }
    let missing: Vec<usize> = (0..counts.len())
        .filter(|&i| after[i].is_none() && counts[i].create)
        .collect();
    if !missing.is_empty() {
        let mut add = Batch::default();
        for &i in &missing {
            let c = &counts[i];
            add.add(&c.key, &c.by.to_string(), c.exptime);
        }
        let replies = server.call(add, deadline).await?;
        let mut raced = Vec::new();
        for (j, &i) in missing.iter().enumerate() {
            match replies.get(j) {
                Some(Reply::Stored) => after[i] = Some(counts[i].by),
                Some(Reply::NotStored) => raced.push(i),
                other => return Err(bad_reply(server, other)),
            }
        }
        if !raced.is_empty() {
            let mut again = Batch::default();
            for &i in &raced {
                again.incr(&counts[i].key, counts[i].by);
            }
            let replies = server.call(again, deadline).await?;
            for (j, &i) in raced.iter().enumerate() {
                // Gone again already (evicted): these hits are all it holds.
                after[i] = Some(number(replies.get(j))?.unwrap_or(counts[i].by));
            }
        }
    }
    // A peek (or a hit held back) of a key missing when the batch was sent was answered
    // NOT_FOUND even when hits before it in the same call went on to `add` the key: its `incr`
    // ran before their `add`. It answers what those hits left, as it would have in order.
    for i in 0..counts.len() {
        if after[i].is_none() {
            let earlier = (0..i).rev().find(|&j| counts[j].key == counts[i].key);
            after[i] = earlier.and_then(|j| after[j]);
        }
    }
    Ok(after.into_iter().map(|a| a.unwrap_or(0)).collect())
}

/// The fixed-window refunds `keys` (a hit's index and its key) on one server, in one call of
/// `decr`s: each key's count left, 0 for a key memcached does not hold.
async fn decrement_on(
    server: &Server,
    hits: &[Hit<'_>],
    keys: &[(usize, String)],
    deadline: Instant,
) -> Result<Vec<(usize, u64)>, StoreError> {
    let mut batch = Batch::default();
    for (i, key) in keys {
        batch.decr(key, hits[*i].hits);
    }
    let replies = server.call(batch, deadline).await?;
    keys.iter()
        .enumerate()
        .map(|(j, (i, _))| match replies.get(j) {
            Some(Reply::Number(n)) => Ok((*i, *n)),
            Some(Reply::NotFound) => Ok((*i, 0)),
            other => Err(bad_reply(server, other)),
        })
        .collect()
}

/// The servers an SRV name gives now.
async fn srv_servers(name: &str, resolver: Option<SocketAddr>) -> Result<Vec<String>, String> {
    let resolver = match resolver {
        Some(at) => srv::Resolver::at(at),
        None => srv::Resolver::system()?,
    };
    resolver.servers(name).await
}

/// MEMCACHE_SRV_REFRESH: looks the servers up again every `every`; a failed lookup keeps the
/// list (and is logged), as in Go.
async fn refresh_servers(
    list: std::sync::Weak<ServerList>,
    name: String,
    every: Duration,
    resolver: Option<SocketAddr>,
) {
    loop {
        tokio::time::sleep(every).await;
        let found = srv_servers(&name, resolver).await;
        let Some(list) = list.upgrade() else { return };
        match found {
            Ok(servers) => list.set(servers, false),
            Err(e) => tracing::warn!(srv = %name, error = %e, "failed to refresh memcache hosts"),
        }
    }
}

/// MEMCACHE_TLS's connector: the CA (else the system's roots), the client certificate, and
/// with MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION a verifier that checks the chain, not the name.
fn tls_connector(tls: &MemcacheTls) -> Result<tokio_rustls::TlsConnector, StoreError> {
    let mut config = tls
        .client
        .rustls_config()
        .map_err(|e| backend(format!("MEMCACHE_TLS: {e}")))?;
    if tls.skip_hostname_verification {
        let verifier = crate::tls::any_name_verifier(&tls.client)
            .map_err(|e| backend(format!("MEMCACHE_TLS: {e}")))?;
        config.dangerous().set_certificate_verifier(verifier);
    }
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

impl CounterStore for MemcacheStore {
    fn apply<'a>(
        &'a self,
        now: Timestamp,
        hits: &'a [Hit<'a>],
        out: &'a mut Vec<Decision>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        penalty::apply(self, now, hits, out)
    }

    fn refund<'a>(
        &'a self,
        now: Timestamp,
        hits: &'a [Hit<'a>],
        out: &'a mut Vec<Decision>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        self.refund_now(now, hits, out)
    }

    fn counts_refused(&self, quota: &Quota) -> bool {
        go_fixed::counts_refused(quota, self.stop_when_over, self.local_cache.is_some())
    }

    fn reset<'a>(
        &'a self,
        now: Timestamp,
        hits: &'a [Hit<'a>],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        self.reset_now(now, hits)
    }
}

/// Penalties as items beside the counters' ([`penalty::penalty_key`]) whose value is when the
/// penalty ends, in microseconds, and which expire a second after that.
impl Penalized for MemcacheStore {
    fn apply_counters<'a>(
        &'a self,
        now: Timestamp,
        hits: &'a [Hit<'a>],
        out: &'a mut Vec<Decision>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        self.apply_now(now, hits, out)
    }

    async fn penalty_ends<'a>(
        &'a self,
        _now: Timestamp,
        hits: &'a [Hit<'a>],
    ) -> Result<Vec<Option<Timestamp>>, StoreError> {
        let deadline = self.deadline();
        let mut groups: Groups<(usize, String)> = Vec::new();
        for (i, hit) in hits.iter().enumerate() {
            let key = memcached_key(penalty::penalty_key(hit.key, &hit.quota));
            group(&mut groups, self.servers.pick(&key)?, (i, key));
        }
        let mut ends = vec![None; hits.len()];
        for (server, keys) in &groups {
            let mut batch = Batch::default();
            let names: Vec<&str> = keys.iter().map(|(_, k)| k.as_str()).collect();
            batch.get(&names);
            let reply = server.call(batch, deadline).await?;
            let Some(Reply::Values(items)) = reply.first() else {
                return Err(bad_reply(server, reply.first()));
            };
            for (i, key) in keys {
                let until = items
                    .iter()
                    .find(|it| &it.key == key)
                    .and_then(|it| it.number());
                ends[*i] = until.map(|u| Timestamp::from_micros(u64::try_from(u).unwrap_or(0)));
            }
        }
        Ok(ends)
    }

    async fn record_penalties<'a>(
        &'a self,
        now: Timestamp,
        records: &'a [penalty::Record<'a>],
    ) -> Result<(), StoreError> {
        let deadline = self.deadline();
        let mut groups: Groups<(String, Timestamp)> = Vec::new();
        for r in records {
            let key = memcached_key(penalty::penalty_key(r.key, &r.quota));
            group(&mut groups, self.servers.pick(&key)?, (key, r.until));
        }
        for (server, items) in &groups {
            let mut batch = Batch::default();
            for (key, until) in items {
                let secs = until
                    .micros()
                    .saturating_sub(now.micros())
                    .div_ceil(1_000_000);
                batch.set(key, &until.micros().to_string(), exptime(secs, now));
            }
            server.call(batch, deadline).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiries_are_a_second_longer_and_past_30_days_the_time_they_end() {
        let now = Timestamp::from_secs(1_700_000_000);
        assert_eq!(exptime(60, now), 61);
        assert_eq!(exptime(MAX_RELATIVE_EXPIRY - 1, now), MAX_RELATIVE_EXPIRY);
        assert_eq!(
            exptime(MAX_RELATIVE_EXPIRY, now),
            1_700_000_000 + MAX_RELATIVE_EXPIRY + 1
        );
        assert_eq!(exptime(365 * 86_400, now), 1_700_000_000 + 365 * 86_400 + 1);
    }
}
