//! The Redis store: counters shared by every replica, and by envoyproxy/ratelimit instances
//! during a migration.
//!
//! **Fixed window** is the Go service's, byte for byte: key
//! `CACHE_KEY_PREFIX + domain_k_v_..._<window start>`, `INCRBY key hits` then
//! `EXPIRE key unit + jitter` (jitter in `[0, EXPIRATION_JITTER_MAX_SECONDS)`), sent on every
//! call, all descriptors of a request in one pipeline.
//!
//! **The other algorithms** are one Lua script each ([`SLIDING`], [`BUCKET`], [`SLOTS`]), loaded once and
//! run by SHA (`EVALSHA`; on `NOSCRIPT` the scripts are loaded again and the pipeline retried
//! once). Each script touches exactly one key, so no hash tags are needed on Redis Cluster.
//! A script returns the state it found; the decision is then computed by the same pure
//! function the memory store uses ([`crate::limiter`]), so both stores answer alike.
//!
//! **Round trips.** One connection per Redis, multiplexed: concurrent requests share it and
//! redis-rs pipelines their commands, so there is not one round trip per request. On Redis
//! Cluster, each key's commands go to its node concurrently.
//!
//! **Topologies.** REDIS_TYPE=single keeps one connection; `cluster` one cluster connection
//! routing by slot; `sentinel` one connection to the master the sentinels name, replaced when
//! it fails or is demoted (see [`super::redis_sentinel`]). Each is made, and replaced after a
//! failure, by its target's supervisor ([`super::redis_target`]).
//!
//! **TLS** (REDIS_TLS): rustls on ring, through the redis crate, with REDIS_TLS_CACERT as the
//! only roots when set (else the system's), REDIS_TLS_CLIENT_CERT/_KEY presented to Redis, and
//! REDIS_TLS_SKIP_HOSTNAME_VERIFICATION accepting a certificate for another name whose chain
//! still verifies, as Go's does.
//!
//! **Failures.** Every call is bounded by REDIS_TIMEOUT. An error is a
//! [`StoreError::Backend`], answered as UNKNOWN (or OK where the operator chose to fail open).
//! Once a Redis is known down, calls fail at once instead of waiting REDIS_TIMEOUT, and a
//! probe every SLUICE_REDIS_PROBE_INTERVAL_MS restores service when it answers again (see
//! [`super::breaker`]). At start-up Sluice does not wait for Redis: calls made during
//! the first connection attempt wait for it (within REDIS_TIMEOUT), and if it failed calls
//! fail at once while a task pings Redis with back-off (1 s doubling to 30 s);
//! [`RedisStore::is_ready`] (so `/healthcheck`) stays false until it answers.
//!
//! **Local over-limit cache** (LOCAL_CACHE_SIZE_IN_BYTES): see [`super::go_fixed`].

use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use super::allowance::{AllowanceTuning, Allowances, Answer, RESERVE, Refill, Route};
use super::breaker::Readiness;
use super::go_fixed::{self, Jitter, OverLimitCache};
use super::penalty::{self, Penalized};
use super::redis_target::{Target, TargetOptions, run_within};
use super::{CounterStore, Hit, StoreError};
use crate::clock::Timestamp;
use crate::key::{go_cache_key, remote_key, state_key};
use crate::limiter::Decision;
use crate::limiter::concurrency::Slots;
use crate::limiter::{Algorithm, Quota, Unit, bucket, sliding_window};

pub use super::breaker::{BreakerSettings, BreakerStats};
pub(crate) use super::redis_client::{Auth, RedisAddress, read_credentials};
pub use super::redis_client::{
    Credentials, RedisNode, RedisTarget, RedisTls, RedisTopology, StartupBackoff,
};

/// The sliding window (see [`sliding_window`]).
///
/// KEYS[1]: the counter, a hash of `i` (window index), `c` (its count), `p` (the previous
/// window's count).
/// ARGV: the current window's index, the µs of it elapsed, its length (µs), limit, hits, TTL
/// (s), charge refused hits (1) or not (0) ([`sliding_window::position`]: a calendar window's
/// length is its own).
/// Admits when `previous * (unit - elapsed) + (current + hits) * unit <= limit * unit`, then
/// stores the rolled counts; a refused call (unless charged) or a peek (0 hits) writes nothing.
/// Returns `{i or -1, c, p}` as found.
pub(crate) const SLIDING: &str = r#"
local idx, elapsed, unit, limit, hits, ttl, charge = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local v = redis.call('HMGET', KEYS[1], 'i', 'c', 'p')
local i, c, p = tonumber(v[1]), tonumber(v[2]) or 0, tonumber(v[3]) or 0
local cur, prev = 0, 0
if i == idx then cur, prev = c, p elseif i == idx - 1 then prev = c end
if hits > 0 and (charge == 1 or prev * (unit - elapsed) + (cur + hits) * unit <= limit * unit) then
  redis.call('HSET', KEYS[1], 'i', idx, 'c', cur + hits, 'p', prev)
  redis.call('EXPIRE', KEYS[1], ttl)
end
return {i or -1, c, p}
"#;

/// The Lua a bucket's scripts share: its time, kept as [`bucket::Shape::text`] writes it (µs
/// since the epoch, and the fraction of a µs to 12 places when there is one), read as whole µs
/// and a numerator over `den` (`requests_per_unit`), and written back. Lua's numbers are
/// doubles: exact for times and durations below 2^53 µs (285 years), and 12 places of a
/// numerator below 2^32 come back exactly.
macro_rules! bucket_time_lua {
    () => {
        r#"
local function read_time(text, den)
  if not text then return 0, 0 end
  local whole, places = string.match(text, '^(%d+)%.?(%d*)$')
  if not whole then error('the key holds ' .. text .. ', not a bucket time') end
  local num = 0
  if places ~= '' then num = math.min(math.floor(tonumber('0.' .. places) * den + 0.5), den - 1) end
  return tonumber(whole), num
end
local function write_time(us, num, den)
  local text = string.format('%.0f', us)
  if num > 0 then text = text .. string.sub(string.format('%.12f', num / den), 2) end
  return text
end
"#
    };
}

/// The token and leaky buckets (see [`bucket`]), in exact arithmetic: every time and duration
/// is whole µs and a numerator over `den` (`requests_per_unit`).
///
/// KEYS[1]: the counter, a string holding the theoretical arrival time: when the bucket is
/// back at rest ([`bucket::Shape::text`]).
/// ARGV: now (µs); den; hits; the hits' emission intervals `hits × T` as whole µs and a
/// numerator; the tolerance likewise (`C × T`, a leaky bucket's `(burst + 1) × T`); charge
/// refused hits (1) or not (0).
/// `after = max(tat, now) + hits × T`; admitted when `after - now <= tolerance`, then stored
/// with a TTL that ends a second after the bucket is back at rest: until then it can change an
/// answer, after it answers as a missing key (the second is for a replica whose clock is
/// behind the writer's). A refused call (unless charged) or a peek writes nothing. Returns the
/// text found (nil for none).
pub(crate) const BUCKET: &str = concat!(
    bucket_time_lua!(),
    r#"
local now, den, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local found = redis.call('GET', KEYS[1])
if n > 0 then
  local us, num = read_time(found, den)
  if us < now or (us == now and num == 0) then us, num = now, 0 end
  us, num = us + tonumber(ARGV[4]), num + tonumber(ARGV[5])
  if num >= den then us, num = us + 1, num - den end
  local ahead, tq, tr = us - now, tonumber(ARGV[6]), tonumber(ARGV[7])
  if ARGV[8] == '1' or ahead < tq or (ahead == tq and num <= tr) then
    redis.call('SET', KEYS[1], write_time(us, num, den), 'PX', math.ceil((ahead + 1) / 1000) + 1000)
  end
end
return found
"#
);

/// A concurrency limit's slots (see [`crate::limiter::concurrency`]): a start takes slots or
/// is refused into the debt, a refund pays the debt off and then gives back the oldest slots.
///
/// KEYS[1]: the counter, a string holding [`Slots::text`]: the debt of refused hits, its end
/// (µs), then each held slot's expiry (µs since the epoch), oldest first. One key, so on Redis
/// Cluster the script runs on that key's slot and needs no hash tag.
/// ARGV: now (µs), the window (µs), the limit, hits, `s` (a start) or `r` (a refund), and
/// whether a refused start is kept as a debt (1) or not (0, `charge_refused: false`).
/// Expired slots and an ended debt are dropped first; then a start of `n` takes `n` slots,
/// each expiring a window from now, when `held + n <= limit`, else adds `n` to the debt (its
/// end a window from now); a refund of `n` pays off the debt first and frees the rest of `n`
/// as the oldest slots. The key is written back with a PX that ends one second after its
/// last slot or its debt does (so Redis itself drops a counter whose refunds never came; no
/// sweeper), or deleted when it holds nothing; a call that changed nothing writes nothing (a
/// peek writes only to drop expired slots, so each is reported expired once). Returns the
/// text found (nil for none), which the store decides on with the same pure function.
/// Lua's numbers are doubles: exact for µs below 2^53 (285 years).
pub const SLOTS: &str = r#"
local now, window, limit, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local found = redis.call('GET', KEYS[1])
if not found and (n == 0 or ARGV[5] == 'r') then return found end
local nums = {}
if found then for x in string.gmatch(found, '%d+') do nums[#nums + 1] = tonumber(x) end end
local debt, debt_until = nums[1] or 0, nums[2] or 0
if debt_until <= now then debt, debt_until = 0, 0 end
local held = {}
for i = 3, #nums do if nums[i] > now then held[#held + 1] = nums[i] end end
table.sort(held)
if ARGV[5] == 's' then
  if #held + n <= limit then
    for _ = 1, n do held[#held + 1] = now + window end
  elseif ARGV[6] == '1' then
    debt, debt_until = debt + n, math.max(debt_until, now + window)
  end
else
  local paid = math.min(n, debt)
  debt = debt - paid
  if debt == 0 then debt_until = 0 end
  local free = math.min(n - paid, #held)
  local kept = {}
  for i = free + 1, #held do kept[#kept + 1] = held[i] end
  held = kept
end
local last = math.max(held[#held] or 0, debt_until)
if last <= now then
  redis.call('DEL', KEYS[1])
  return found
end
local parts = {string.format('%.0f', debt), string.format('%.0f', debt_until)}
for i = 1, #held do parts[#parts + 1] = string.format('%.0f', held[i]) end
local text = table.concat(parts, ' ')
if text ~= found then
  redis.call('SET', KEYS[1], text, 'PX', math.ceil((last - now) / 1000) + 1000)
end
return found
"#;

/// Takes hits off a counter (a refund), and returns what is left in the form the charging
/// command answers, so the store decides a peek on it as on a charge.
///
/// KEYS[1]: the counter: a fixed window's Go key (a count), a sliding-window hash or a bucket
/// string. One key per call, so on Redis Cluster the script runs on that key's slot.
/// ARGV[1] is the kind, and the rest depends on it:
/// - `f`, hits: the count goes down by `hits`, floored at 0, its TTL kept (a Go instance
///   sharing the key sees the same count, and it still expires with its window); a missing key
///   stays missing. Returns the count left (0 for none), as INCRBY answers.
/// - `s`, the current window's index, hits: `c -= hits`, floored at 0, if `i` is still it.
///   Returns `{i or -1, c, p}` as left, as [`SLIDING`] answers.
/// - `b`, den, and `hits × T` as whole µs and a numerator: the bucket's time moves back by that
///   (never before the epoch; a time in the past is a bucket at rest), its TTL kept. Returns the
///   text left (nil for none), as [`BUCKET`] answers.
pub(crate) const REFUND: &str = concat!(
    bucket_time_lua!(),
    r#"
if ARGV[1] == 'f' then
  local c = tonumber(redis.call('GET', KEYS[1]))
  if not c then return 0 end
  local left = math.max(c - tonumber(ARGV[2]), 0)
  if left ~= c then redis.call('SET', KEYS[1], string.format('%.0f', left), 'KEEPTTL') end
  return left
elseif ARGV[1] == 's' then
  local idx, hits = tonumber(ARGV[2]), tonumber(ARGV[3])
  local v = redis.call('HMGET', KEYS[1], 'i', 'c', 'p')
  local i, c, p = tonumber(v[1]), tonumber(v[2]) or 0, tonumber(v[3]) or 0
  if i == idx and hits > 0 and c > 0 then
    c = math.max(c - hits, 0)
    redis.call('HSET', KEYS[1], 'c', c)
  end
  return {i or -1, c, p}
else
  local found = redis.call('GET', KEYS[1])
  if found then
    local den = tonumber(ARGV[2])
    local us, num = read_time(found, den)
    us, num = us - tonumber(ARGV[3]), num - tonumber(ARGV[4])
    if num < 0 then us, num = us - 1, num + den end
    if us < 0 then us, num = 0, 0 end
    found = write_time(us, num, den)
    redis.call('SET', KEYS[1], found, 'KEEPTTL')
  end
  return found
end
"#
);

/// How to reach Redis, and how the store uses it (REDIS_* and the breaker's settings).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisConfig {
    pub main: RedisTarget,
    /// REDIS_PERSECOND: where SECOND limits go.
    pub per_second: Option<RedisTarget>,
    pub timeout: Duration,
    pub expiration_jitter_max_seconds: u64,
    pub local_cache_size_in_bytes: u64,
    /// SLUICE_LOCAL_CACHE_MAX_AGE_MS: how long an over-limit entry is trusted.
    pub local_cache_max_age: Duration,
    pub stop_cache_key_increment_when_overlimit: bool,
    /// SLUICE_REDIS_ALLOWANCE: batches of hot fixed-window keys reserved ([`super::allowance`]).
    pub allowance: Option<AllowanceTuning>,
    /// REDIS_STARTUP_*: how the start-up PING is retried.
    pub startup: StartupBackoff,
    /// SLUICE_REDIS_PROBE_INTERVAL_MS, SLUICE_REDIS_BREAKER_TIMEOUTS and
    /// REDIS_HEALTH_CHECK_ACTIVE_CONNECTION: failing fast while Redis is down.
    pub breaker: BreakerSettings,
}

/// The Redis counter store.
pub struct RedisStore {
    main: Arc<Target>,
    per_second: Option<Arc<Target>>,
    timeout: Duration,
    stop_when_over: bool,
    local_cache: Option<OverLimitCache>,
    jitter: Jitter,
    /// SLUICE_REDIS_ALLOWANCE: the batches this replica holds.
    allowances: Option<Arc<Allowances>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    options: Arc<TargetOptions>,
}

/// The scripts each Redis is loaded with (and again on NOSCRIPT).
const SCRIPTS: &[&str] = &[SLIDING, BUCKET, REFUND, SLOTS, RESERVE];

impl Drop for RedisStore {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn backend_error(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend {
        message: e.to_string(),
    }
}

impl RedisStore {
    /// Builds the store and starts connecting in the background; never waits for Redis.
    /// Must be called inside a tokio runtime.
    pub fn start(settings: &RedisConfig) -> Result<Self, StoreError> {
        let targets = 1 + usize::from(settings.per_second.is_some());
        let options = Arc::new(TargetOptions {
            timeout: settings.timeout,
            startup: settings.startup,
            gave_up: tokio::sync::watch::channel(None).0,
            breaker: settings.breaker,
            readiness: Readiness::new(targets, settings.breaker.health_follows_connection),
            scripts: SCRIPTS,
        });
        let mut tasks = Vec::new();
        let main = Target::start("main", &settings.main, &options, &mut tasks)?;
        let per_second = settings
            .per_second
            .as_ref()
            .map(|t| Target::start("per_second", t, &options, &mut tasks))
            .transpose()?;
        Ok(RedisStore {
            main,
            per_second,
            timeout: settings.timeout,
            stop_when_over: settings.stop_cache_key_increment_when_overlimit,
            local_cache: OverLimitCache::new(
                settings.local_cache_size_in_bytes,
                settings.local_cache_max_age,
            ),
            jitter: Jitter::new(settings.expiration_jitter_max_seconds),
            // The STOP flag's rule needs every key's count before a request is decided, which
            // a batch does not have: settings refuse the two together, and a store built
            // with both keeps the flag.
            allowances: settings
                .allowance
                .filter(|_| !settings.stop_cache_key_increment_when_overlimit)
                .map(|t| Arc::new(Allowances::new(t))),
            tasks,
            options,
        })
    }

    /// SLUICE_REDIS_ALLOWANCE: a task that, every horizon, gives back to Redis what keys gone
    /// cold still hold of their batches in the current window (the REFUND script, which keeps
    /// the key's TTL and never goes below 0), so the other replicas can use it. Without
    /// allowances, the store as it was.
    pub fn with_give_back(mut self, clock: Arc<dyn crate::clock::Clock>) -> Self {
        let Some(a) = self.allowances.clone() else {
            return self;
        };
        let every = Duration::from_micros(a.tuning().horizon_us);
        let (main, per_second, timeout) =
            (self.main.clone(), self.per_second.clone(), self.timeout);
        self.tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let now = clock.now();
                for (key, quota, hits) in a.give_back(now) {
                    let target = match (&per_second, quota.unit) {
                        (Some(t), Unit::Second) => t,
                        _ => &main,
                    };
                    let mut pipe = redis::pipe();
                    let hit = Hit {
                        key: &key,
                        quota,
                        hits,
                    };
                    push_refund(&mut pipe, &hit, now);
                    // A give-back that fails leaves the hits held back until the window ends:
                    // under-admission, never over.
                    let _ = run_within(target, &pipe, timeout, SCRIPTS).await;
                }
            }
        }));
        self
    }

    /// Completes, with the reason, when REDIS_STARTUP_MAX_ELAPSED_TIME passed before Redis
    /// answered its start-up PING; never otherwise. The app then stops, as the Go service does.
    pub fn gave_up(&self) -> impl std::future::Future<Output = String> + Send + 'static {
        let mut rx = self.options.gave_up.subscribe();
        async move {
            let reason = rx
                .wait_for(Option::is_some)
                .await
                .map(|reason| reason.clone().unwrap_or_default());
            match reason {
                Ok(reason) => reason,
                // The store is gone: nothing will ever give up.
                Err(_) => std::future::pending().await,
            }
        }
    }

    /// True once every configured Redis has answered its start-up PING and, with
    /// REDIS_HEALTH_CHECK_ACTIVE_CONNECTION, while none is down (its breaker open).
    pub fn is_ready(&self) -> bool {
        self.options.readiness.is_ready()
    }

    /// [`RedisStore::is_ready`], pushed at the instant it changes.
    pub fn ready_changes(&self) -> tokio::sync::watch::Receiver<bool> {
        self.options.readiness.subscribe()
    }

    /// SLUICE_REDIS_ALLOWANCE's counters and gauges ([`Allowances::snapshot`]); empty when it
    /// is off.
    pub fn allowance_stats(&self) -> Vec<(&'static str, u64)> {
        self.allowances
            .as_ref()
            .map(|a| a.snapshot())
            .unwrap_or_default()
    }

    /// Each Redis's breaker: up, opens, calls answered at once.
    pub fn breakers(&self) -> Vec<BreakerStats> {
        std::iter::once(&self.main)
            .chain(&self.per_second)
            .map(|t| t.stats())
            .collect()
    }

    fn target_for(&self, unit: Unit) -> &Arc<Target> {
        match (&self.per_second, unit) {
            (Some(t), Unit::Second) => t,
            _ => &self.main,
        }
    }

    /// Runs `pipe` on `target` within the deadline; on NOSCRIPT loads the scripts and retries.
    async fn run(&self, target: &Target, pipe: &redis::Pipeline) -> Result<Vec<Value>, StoreError> {
        run_within(target, pipe, self.timeout, SCRIPTS).await
    }

    /// Adds the commands for one hit; returns how many replies they produce.
    fn push(&self, pipe: &mut redis::Pipeline, hit: &Hit<'_>, now: Timestamp, increment: bool) {
        let q = hit.quota;
        match q.algorithm {
            Algorithm::FixedWindow => {
                let key = go_cache_key(hit.key, now, q.window());
                let hits = if go_fixed::increments(hit, increment) {
                    hit.hits
                } else {
                    0
                };
                pipe.cmd("INCRBY").arg(&key).arg(hits);
                pipe.cmd("EXPIRE")
                    .arg(&key)
                    .arg(self.jitter.ttl_secs(&key, q.window(), now))
                    .ignore();
            }
            Algorithm::SlidingWindow => {
                let (index, elapsed_us, unit_us) =
                    sliding_window::position(now.micros(), q.window());
                pipe.cmd("EVALSHA")
                    .arg(redis::Script::new(SLIDING).get_hash())
                    .arg(1)
                    .arg(state_key(hit.key, &hit.quota))
                    .arg(index)
                    .arg(elapsed_us)
                    .arg(unit_us)
                    .arg(q.requests_per_unit)
                    .arg(hit.hits)
                    .arg(2 * q.window().max_secs() + self.jitter.max_secs)
                    .arg(u8::from(q.charge_refused));
            }
            Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                let Some(shape) = bucket::Shape::of(&q) else {
                    // A rate of 0 holds nothing and is decided without Redis
                    // (`decide_without_state`); were one sent, GET answers as the script does
                    // and writes nothing.
                    pipe.cmd("GET").arg(state_key(hit.key, &hit.quota));
                    return;
                };
                let hits_span = u128::from(hit.hits).saturating_mul(shape.interval());
                let (hits_us, hits_ticks) = shape.split(hits_span);
                let (tolerance_us, tolerance_ticks) = shape.split(shape.tolerance());
                let whole = |us: u128| u64::try_from(us).unwrap_or(u64::MAX);
                pipe.cmd("EVALSHA")
                    .arg(redis::Script::new(BUCKET).get_hash())
                    .arg(1)
                    .arg(state_key(hit.key, &hit.quota))
                    .arg(now.micros())
                    .arg(shape.den())
                    .arg(hit.hits)
                    .arg(whole(hits_us))
                    .arg(hits_ticks)
                    .arg(whole(tolerance_us))
                    .arg(tolerance_ticks)
                    .arg(u8::from(q.charge_refused));
            }
            Algorithm::Concurrency => push_slots(pipe, hit, now, "s"),
        }
    }

    /// Turns one hit's reply into the decision the pure algorithm gives for the state found.
    fn decide(hit: &Hit<'_>, now: Timestamp, reply: &Value) -> Result<Decision, StoreError> {
        let q = hit.quota;
        let bad = || backend_error(format!("unexpected Redis reply {reply:?}"));
        let int = |v: &Value| match v {
            Value::Int(i) => Ok(*i),
            _ => Err(bad()),
        };
        Ok(match q.algorithm {
            Algorithm::FixedWindow => {
                go_fixed::counted(hit, now, u64::try_from(int(reply)?).unwrap_or(0))
            }
            Algorithm::SlidingWindow => {
                let Value::Array(parts) = reply else {
                    return Err(bad());
                };
                let [i, c, p] = parts.as_slice() else {
                    return Err(bad());
                };
                let num = |v: &Value| int(v).map(|n| u64::try_from(n).unwrap_or(0));
                // A missing counter (-1) is the empty state.
                let state = match int(i)? {
                    idx if idx >= 0 => sliding_window::state_from_parts(
                        u64::try_from(idx).unwrap_or(0),
                        num(c)?,
                        num(p)?,
                    ),
                    _ => sliding_window::EMPTY,
                };
                let rpu = q.requests_per_unit;
                let charge = q.charge_refused;
                sliding_window::decide(state, now.micros(), q.window(), rpu, hit.hits, charge).0
            }
            Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                let state = match (reply, bucket::Shape::of(&q)) {
                    (Value::Nil, _) | (_, None) => bucket::EMPTY,
                    (Value::BulkString(text), Some(shape)) => std::str::from_utf8(text)
                        .ok()
                        .and_then(|text| shape.parse(text))
                        .ok_or_else(bad)?,
                    _ => return Err(bad()),
                };
                bucket::decide(state, now.micros(), &q, hit.hits).0
            }
            Algorithm::Concurrency => slots_step(hit, now, reply, false)?,
        })
    }

    async fn apply_now(
        &self,
        now: Timestamp,
        hits: &[Hit<'_>],
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        if let Some(a) = &self.allowances {
            return self.apply_with_allowances(a, now, hits, out).await;
        }
        let mut decisions = go_fixed::cached_decisions(self.local_cache.as_ref(), now, hits);
        // What the cache answered is not remembered again: an entry is trusted for its age
        // from when Redis found the key over, not from when the cache last answered.
        let cached: Vec<bool> = decisions.iter().map(Option::is_some).collect();
        let increment = self.increments(now, hits, &decisions).await?;
        decide_without_state(now, hits, &mut decisions);
        // One pipeline per Redis (per key on a cluster), all concurrently.
        let groups = self.pipelines(
            hits.iter()
                .enumerate()
                .filter(|(i, _)| decisions[*i].is_none()),
        );
        let replies = futures_util::future::join_all(groups.iter().map(|(target, idx)| {
            let mut pipe = redis::pipe();
            for &i in idx {
                self.push(&mut pipe, &hits[i], now, increment[i]);
            }
            async move { self.run(target, &pipe).await }
        }))
        .await;
        for ((_, idx), reply) in groups.iter().zip(replies) {
            let reply = checked_len(reply, idx.len())?;
            for (&i, value) in idx.iter().zip(&reply) {
                decisions[i] = Some(Self::decide(&hits[i], now, value)?);
            }
        }
        self.answer(now, hits, (&decisions, &cached), out)
    }

    /// SLUICE_REDIS_ALLOWANCE: each hit goes to its batch ([`Allowances::route`]), in rounds:
    /// what the batches decide is answered at once, the reservations and the store's own
    /// commands go in one pipeline per Redis, and a hit whose key already has one in the
    /// round (a key repeated in the request), or whose batch waits for another call's
    /// reservation, is routed again in the next round. A call waits for others' reservations
    /// at most REDIS_TIMEOUT, then goes the store's own way. (The STOP flag is never on with
    /// allowances: `RedisStore::start`.)
    async fn apply_with_allowances(
        &self,
        a: &Arc<Allowances>,
        now: Timestamp,
        hits: &[Hit<'_>],
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        let mut decisions = go_fixed::cached_decisions(self.local_cache.as_ref(), now, hits);
        let cached: Vec<bool> = decisions.iter().map(Option::is_some).collect();
        decide_without_state(now, hits, &mut decisions);
        let deadline = tokio::time::Instant::now() + self.timeout;
        while decisions.iter().any(Option::is_none) {
            let landed = a.landed();
            tokio::pin!(landed);
            landed.as_mut().enable();
            let may_wait = tokio::time::Instant::now() < deadline;
            let ops = self.route_round(a, now, hits, &mut decisions, may_wait);
            if ops.is_empty() {
                if decisions.iter().any(Option::is_none) {
                    let _ = tokio::time::timeout_at(deadline, landed).await;
                }
                continue;
            }
            self.send_round(a, now, hits, &ops, &mut decisions).await?;
        }
        self.answer(now, hits, (&decisions, &cached), out)
    }

    /// One round's routing: the hits the batches decide (their refills sent in the
    /// background), and the operations to send for the others, one per key.
    fn route_round(
        &self,
        a: &Arc<Allowances>,
        now: Timestamp,
        hits: &[Hit<'_>],
        decisions: &mut [Option<Decision>],
        may_wait: bool,
    ) -> Vec<(usize, Op)> {
        let mut ops: Vec<(usize, Op)> = Vec::new();
        let mut refills = Vec::new();
        for (i, hit) in hits.iter().enumerate() {
            // A hit waits for every earlier hit of its key in the request (sent in this
            // round, or waiting for a reservation): a peek after a waiting hit must see it.
            let earlier = hits[..i]
                .iter()
                .zip(decisions.iter())
                .any(|(h, d)| d.is_none() && h.key == hit.key);
            if decisions[i].is_some() || earlier {
                continue;
            }
            match a.route(hit, now, may_wait) {
                Route::Local { decision, refill } => {
                    decisions[i] = Some(decision);
                    refills.extend(refill.map(|r| (i, r)));
                }
                Route::Reserve(r) => ops.push((i, Op::Reserve(r))),
                Route::Remote { held, ahead } => {
                    ops.push((i, Op::Store { held }));
                    refills.extend(ahead.map(|r| (i, r)));
                }
                Route::Wait => {}
            }
        }
        // In the background at once: whatever becomes of this call, a reservation marked
        // under way is made (or fails), so none stays marked.
        self.refill(now, hits, &refills);
        ops
    }

    /// Sends one round's operations, one pipeline per Redis (per key on a cluster), all
    /// concurrently, and decides their hits. A reservation that got no answer is given up.
    async fn send_round(
        &self,
        a: &Arc<Allowances>,
        now: Timestamp,
        hits: &[Hit<'_>],
        ops: &[(usize, Op)],
        decisions: &mut [Option<Decision>],
    ) -> Result<(), StoreError> {
        let mut pending = Reservations::new(a, hits, ops);
        let groups = self.pipelines(ops.iter().enumerate().map(|(k, &(i, _))| (k, &hits[i])));
        let replies = futures_util::future::join_all(groups.iter().map(|(target, idx)| {
            let mut pipe = redis::pipe();
            for &k in idx {
                let (i, op) = ops[k];
                match op {
                    Op::Reserve(r) => self.push_reserve(&mut pipe, &hits[i], now, r),
                    Op::Store { .. } => self.push(&mut pipe, &hits[i], now, true),
                }
            }
            async move { self.run(target, &pipe).await }
        }))
        .await;
        let mut failed = None;
        for ((_, idx), reply) in groups.iter().zip(replies) {
            let decided = checked_len(reply, idx.len()).and_then(|reply| {
                for (&k, value) in idx.iter().zip(&reply) {
                    let (i, op) = ops[k];
                    decisions[i] = Some(self.decide_op(a, &hits[i], now, op, value)?);
                    pending.answered(k);
                }
                Ok(())
            });
            failed = failed.or(decided.err());
        }
        failed.map_or(Ok(()), Err)
    }

    /// One operation's reply turned into its hit's decision.
    fn decide_op(
        &self,
        a: &Allowances,
        hit: &Hit<'_>,
        now: Timestamp,
        op: Op,
        reply: &Value,
    ) -> Result<Decision, StoreError> {
        Ok(match op {
            Op::Reserve(r) => a.reserved(hit, now, r, reserve_reply(reply)?),
            Op::Store { held } if hit.quota.algorithm == Algorithm::FixedWindow => {
                let count = match reply {
                    Value::Int(n) => u64::try_from(*n).unwrap_or(0),
                    _ => return Err(backend_error(format!("unexpected Redis reply {reply:?}"))),
                };
                a.remote(hit, now, held, count)
            }
            Op::Store { .. } => Self::decide(hit, now, reply)?,
        })
    }

    /// Adds the [`RESERVE`] call for `r.want` hits of `hit`'s fixed-window key in window
    /// `r.window`. A key reserved ahead lives until its own window's end, as one first counted
    /// in it would.
    fn push_reserve(&self, pipe: &mut redis::Pipeline, hit: &Hit<'_>, now: Timestamp, r: Refill) {
        let q = hit.quota;
        let start = Timestamp::from_secs(q.window().start(r.window));
        let key = go_cache_key(hit.key, start, q.window());
        let early = start.secs().saturating_sub(now.secs());
        pipe.cmd("EVALSHA")
            .arg(redis::Script::new(RESERVE).get_hash())
            .arg(1)
            .arg(&key)
            .arg(r.want)
            .arg(q.requests_per_unit)
            .arg(self.jitter.ttl_secs(&key, q.window(), now) + early)
            .arg(r.hits)
            .arg(r.held)
            .arg(u8::from(r.past));
    }

    /// The batches that ran low are reserved again in the background, one call each, so the
    /// next calls need no round trip.
    fn refill(&self, now: Timestamp, hits: &[Hit<'_>], refills: &[(usize, Refill)]) {
        let Some(a) = &self.allowances else {
            return;
        };
        for &(i, r) in refills {
            let hit = &hits[i];
            let mut pipe = redis::pipe();
            self.push_reserve(&mut pipe, hit, now, r);
            let (a, target, timeout) = (
                a.clone(),
                self.target_for(hit.quota.unit).clone(),
                self.timeout,
            );
            let (key, quota) = (hit.key.to_owned(), hit.quota);
            tokio::spawn(async move {
                let reply = run_within(&target, &pipe, timeout, SCRIPTS).await;
                match reply
                    .ok()
                    .as_deref()
                    .and_then(|r| r.first())
                    .map(reserve_reply)
                {
                    Some(Ok(answer)) => {
                        let hit = Hit {
                            key: &key,
                            quota,
                            hits: 0,
                        };
                        a.reserved(&hit, now, r, answer);
                    }
                    _ => a.failed(&key, r),
                }
            });
        }
    }

    /// Which hits are added ([`go_fixed::increments_from_counts`]); with
    /// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT this costs a read round trip first, as in Go.
    async fn increments(
        &self,
        now: Timestamp,
        hits: &[Hit<'_>],
        decisions: &[Option<Decision>],
    ) -> Result<Vec<bool>, StoreError> {
        if let Some(all) = go_fixed::increments_without_reading(self.stop_when_over, decisions) {
            return Ok(vec![all; hits.len()]);
        }
        let counts = self.read_counts(now, hits).await?;
        Ok(go_fixed::increments_from_counts(hits, &counts))
    }

    /// The items to send (an index, and the hit it sends), their indices grouped by the
    /// Redis they go to; on a cluster, one per key.
    fn pipelines<'h>(
        &self,
        items: impl Iterator<Item = (usize, &'h Hit<'h>)>,
    ) -> Vec<(&Arc<Target>, Vec<usize>)> {
        let mut groups: Vec<(&Arc<Target>, Vec<usize>)> = Vec::new();
        for (i, hit) in items {
            let target = self.target_for(hit.quota.unit);
            let cluster = target.is_cluster();
            match groups
                .iter_mut()
                .find(|(t, _)| !cluster && Arc::ptr_eq(t, target))
            {
                Some((_, idx)) => idx.push(i),
                None => groups.push((target, vec![i])),
            }
        }
        groups
    }

    /// Every hit's decision, in order, into `out`; fixed-window keys Redis found over the
    /// limit (not the `cached` answers) are remembered by the local cache.
    fn answer(
        &self,
        now: Timestamp,
        hits: &[Hit<'_>],
        (decisions, cached): (&[Option<Decision>], &[bool]),
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        for ((hit, d), &cached) in hits.iter().zip(decisions).zip(cached) {
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

    /// For the STOP flag: each fixed-window hit's count now (`None` for the others).
    async fn read_counts(
        &self,
        now: Timestamp,
        hits: &[Hit<'_>],
    ) -> Result<Vec<Option<u64>>, StoreError> {
        let mut counts = vec![None; hits.len()];
        for (i, hit) in hits.iter().enumerate() {
            if hit.quota.algorithm != Algorithm::FixedWindow {
                continue;
            }
            let mut pipe = redis::pipe();
            pipe.cmd("GET")
                .arg(go_cache_key(hit.key, now, hit.quota.window()));
            let reply = self.run(self.target_for(hit.quota.unit), &pipe).await?;
            counts[i] = Some(match reply.first() {
                Some(Value::BulkString(b)) => std::str::from_utf8(b)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0),
                _ => 0,
            });
        }
        Ok(counts)
    }

    /// Deletes each hit's key: a fixed window's for the current window (the Go service's key,
    /// so a Go instance sharing the Redis sees the reset too), a sliding window's or a bucket's
    /// state; and forgets it in the local over-limit cache.
    async fn reset_now(&self, now: Timestamp, hits: &[Hit<'_>]) -> Result<(), StoreError> {
        for hit in hits {
            let q = hit.quota;
            let key = remote_key(hit.key, &q, now);
            if let Some(cache) = &self.local_cache {
                cache.forget(&key);
            }
            if let Some(a) = &self.allowances {
                a.forget(hit.key);
            }
            let mut pipe = redis::pipe();
            pipe.cmd("DEL").arg(&key);
            self.run(self.target_for(q.unit), &pipe).await?;
        }
        Ok(())
    }

    /// Takes each hit's `hits` off its counter and answers a peek at what is left: one
    /// pipeline per Redis (per key on a cluster), all concurrently, as a charge. A refunded
    /// fixed-window key is forgotten by the local over-limit cache at once; with allowances,
    /// what its batch holds unused is given back with the refund ([`Allowances::refund`]).
    async fn refund_now(
        &self,
        now: Timestamp,
        hits: &[Hit<'_>],
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        // A bucket with a rate of 0 holds nothing: its peek needs no call.
        let mut decisions: Vec<Option<Decision>> = hits
            .iter()
            .map(|h| {
                let q = &h.quota;
                (q.algorithm.takes_burst() && bucket::Shape::of(q).is_none())
                    .then(|| bucket::decide(bucket::EMPTY, now.micros(), q, 0).0)
            })
            .collect();
        let back: Vec<Hit<'_>> = hits
            .iter()
            .map(|h| match &self.allowances {
                Some(a) => Hit {
                    hits: h.hits.saturating_add(a.refund(h, now)),
                    ..*h
                },
                None => *h,
            })
            .collect();
        let groups = self.pipelines(
            back.iter()
                .enumerate()
                .filter(|(i, _)| decisions[*i].is_none()),
        );
        let replies = futures_util::future::join_all(groups.iter().map(|(target, idx)| {
            let mut pipe = redis::pipe();
            for &i in idx {
                push_refund(&mut pipe, &back[i], now);
            }
            async move { self.run(target, &pipe).await }
        }))
        .await;
        for ((_, idx), reply) in groups.iter().zip(replies) {
            let reply = checked_len(reply, idx.len())?;
            for (&i, value) in idx.iter().zip(&reply) {
                let peek = Hit { hits: 0, ..hits[i] };
                decisions[i] = Some(match peek.quota.algorithm {
                    Algorithm::Concurrency => slots_step(&hits[i], now, value, true)?,
                    _ => Self::decide(&peek, now, value)?,
                });
            }
        }
        go_fixed::forget_refunded(self.local_cache.as_ref(), now, hits);
        go_fixed::push_all(hits.len(), decisions, out)
    }
}

/// A pipeline's replies, one per command sent (`expected`), or why not.
fn checked_len(
    reply: Result<Vec<Value>, StoreError>,
    expected: usize,
) -> Result<Vec<Value>, StoreError> {
    match reply {
        Ok(r) if r.len() == expected => Ok(r),
        Ok(r) => Err(StoreError::BadReply {
            expected,
            got: r.len(),
        }),
        Err(e) => Err(e),
    }
}

/// The operation a round sends for one hit with allowances: a reservation, or the store's own
/// command with `held` hits of the key's batch unused ([`Route::Remote`]).
#[derive(Clone, Copy, Debug)]
enum Op {
    Reserve(Refill),
    Store { held: u64 },
}

/// A round's reservations until each is answered: dropped before that (the call failed, or
/// was cancelled while it waited), the others are given up, so none stays marked under way.
struct Reservations<'a> {
    a: &'a Allowances,
    hits: &'a [Hit<'a>],
    ops: &'a [(usize, Op)],
    answered: Vec<bool>,
}

impl<'a> Reservations<'a> {
    fn new(a: &'a Allowances, hits: &'a [Hit<'a>], ops: &'a [(usize, Op)]) -> Self {
        let answered = ops
            .iter()
            .map(|(_, op)| matches!(op, Op::Store { .. }))
            .collect();
        Reservations {
            a,
            hits,
            ops,
            answered,
        }
    }

    fn answered(&mut self, k: usize) {
        self.answered[k] = true;
    }
}

impl Drop for Reservations<'_> {
    fn drop(&mut self) {
        for (&(i, op), done) in self.ops.iter().zip(&self.answered) {
            if let (Op::Reserve(r), false) = (op, done) {
                self.a.failed(self.hits[i].key, r);
            }
        }
    }
}

/// [`RESERVE`]'s reply.
fn reserve_reply(reply: &Value) -> Result<Answer, StoreError> {
    let bad = || backend_error(format!("unexpected reservation reply {reply:?}"));
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    let int = |v: &Value| match v {
        Value::Int(n) => u64::try_from(*n).map_err(|_| bad()),
        _ => Err(bad()),
    };
    match items.as_slice() {
        [granted, count, refused] => Ok(Answer {
            granted: int(granted)?,
            count: int(count)?,
            refused: int(refused)? == 1,
        }),
        _ => Err(bad()),
    }
}

/// Adds the [`SLOTS`] call for one concurrency hit: a start (`s`) or a refund (`r`).
fn push_slots(pipe: &mut redis::Pipeline, hit: &Hit<'_>, now: Timestamp, mode: &str) {
    let q = hit.quota;
    pipe.cmd("EVALSHA")
        .arg(redis::Script::new(SLOTS).get_hash())
        .arg(1)
        .arg(state_key(hit.key, &hit.quota))
        .arg(now.micros())
        .arg(q.window().secs().saturating_mul(1_000_000))
        .arg(q.requests_per_unit)
        .arg(hit.hits)
        .arg(mode)
        .arg(u8::from(q.charge_refused));
}

/// A concurrency hit's decision from the slots [`SLOTS`] found: the same pure step the
/// script took (a start, or a `refund`).
fn slots_step(
    hit: &Hit<'_>,
    now: Timestamp,
    reply: &Value,
    refund: bool,
) -> Result<Decision, StoreError> {
    let bad = || backend_error(format!("unexpected Redis reply {reply:?}"));
    let text = match reply {
        Value::Nil => "0 0",
        Value::BulkString(text) => std::str::from_utf8(text).map_err(|_| bad())?,
        _ => return Err(bad()),
    };
    let mut slots = Slots::parse(text).ok_or_else(bad)?;
    let (now, q) = (now.micros(), &hit.quota);
    Ok(if refund {
        slots.refund(now, q, hit.hits)
    } else {
        slots.decide(now, q, hit.hits)
    })
}

/// Adds the [`REFUND`] call for one hit (a bucket with a rate of 0 is never sent).
fn push_refund(pipe: &mut redis::Pipeline, hit: &Hit<'_>, now: Timestamp) {
    let q = hit.quota;
    if q.algorithm == Algorithm::Concurrency {
        return push_slots(pipe, hit, now, "r");
    }
    let script = pipe
        .cmd("EVALSHA")
        .arg(redis::Script::new(REFUND).get_hash())
        .arg(1);
    match q.algorithm {
        Algorithm::FixedWindow => {
            script
                .arg(go_cache_key(hit.key, now, q.window()))
                .arg("f")
                .arg(hit.hits);
        }
        Algorithm::SlidingWindow => {
            script
                .arg(state_key(hit.key, &hit.quota))
                .arg("s")
                .arg(sliding_window::window_index(now.micros(), q.window()))
                .arg(hit.hits);
        }
        // Sent by `push_refund` before REFUND's call is begun.
        Algorithm::Concurrency => {}
        Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            let (den, us, ticks) = match bucket::Shape::of(&q) {
                Some(shape) => {
                    let back = u128::from(hit.hits).saturating_mul(shape.interval());
                    let (us, ticks) = shape.split(back);
                    (shape.den(), u64::try_from(us).unwrap_or(u64::MAX), ticks)
                }
                None => (1, 0, 0),
            };
            script
                .arg(state_key(hit.key, &hit.quota))
                .arg("b")
                .arg(den)
                .arg(us)
                .arg(ticks);
        }
    }
}

/// Decides the hits that need no state, so nothing is sent for them: a bucket with a rate of 0
/// admits no hit and holds nothing (a charged refusal has no rate to be waited out at; the
/// script would store an arrival time with no end).
fn decide_without_state(now: Timestamp, hits: &[Hit<'_>], decisions: &mut [Option<Decision>]) {
    for (hit, d) in hits.iter().zip(decisions) {
        let q = &hit.quota;
        if d.is_none() && q.algorithm.takes_burst() && bucket::Shape::of(q).is_none() {
            *d = Some(bucket::decide(bucket::EMPTY, now.micros(), q, hit.hits).0);
        }
    }
}

/// A connection to REDIS_URL for another part of Sluice (the peer cluster's write-behind,
/// `crate::cluster::durable`), made exactly as the store makes its own, so the URL, auth,
/// Redis Cluster handling and breaker are shared; REDIS_PERSECOND and the backend-only flags
/// do not apply. Never waits for Redis: it connects in the background, and while Redis is down
/// its calls fail at once, so flushes never queue behind timeouts.
pub struct RedisLink {
    target: Arc<Target>,
    timeout: Duration,
    scripts: &'static [&'static str],
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for RedisLink {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl RedisLink {
    /// Connects to `settings.main`; `scripts` are (re)loaded whenever Redis answers NOSCRIPT.
    /// `name` names it in logs and metrics (`write_behind`, `runtime_limits`). Must be called
    /// inside a tokio runtime.
    pub fn start(
        name: &'static str,
        settings: &RedisConfig,
        scripts: &'static [&'static str],
    ) -> Result<Self, StoreError> {
        let options = Arc::new(TargetOptions {
            timeout: settings.timeout,
            // The write-behind copy is not on the request path: it keeps retrying whatever
            // REDIS_STARTUP_MAX_ELAPSED_TIME says, which is about the Redis backend.
            startup: StartupBackoff {
                max_elapsed: None,
                ..settings.startup
            },
            gave_up: tokio::sync::watch::channel(None).0,
            breaker: settings.breaker,
            // Health never follows the copy: the cluster counts without it.
            readiness: Readiness::new(1, false),
            scripts,
        });
        let mut tasks = Vec::new();
        let target = Target::start(name, &settings.main, &options, &mut tasks)?;
        Ok(RedisLink {
            target,
            timeout: settings.timeout,
            scripts,
            tasks,
        })
    }

    /// True once Redis has answered its start-up PING.
    pub fn is_ready(&self) -> bool {
        self.target.has_answered()
    }

    /// Whether it is Redis Cluster, where one pipeline must stay within one hash slot.
    pub(crate) fn is_cluster(&self) -> bool {
        self.target.is_cluster()
    }

    /// REDIS_TIMEOUT: the deadline of every [`RedisLink::run`].
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Its breaker: up, opens, calls answered at once.
    pub fn breaker(&self) -> BreakerStats {
        self.target.stats()
    }

    /// Runs `pipe` within REDIS_TIMEOUT (script loading included); fails at once while
    /// Redis is down.
    pub async fn run(&self, pipe: &redis::Pipeline) -> Result<Vec<Value>, StoreError> {
        run_within(&self.target, pipe, self.timeout, self.scripts).await
    }
}

impl CounterStore for RedisStore {
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
        // Allowances count refused hits as the store does (`super::allowance`).
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

/// Penalties as keys beside the counters' ([`penalty::penalty_key`]) whose TTL is what is
/// left of the penalty: `PTTL` to read them, `SET ... PX` to start one.
impl Penalized for RedisStore {
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
        now: Timestamp,
        hits: &'a [Hit<'a>],
    ) -> Result<Vec<Option<Timestamp>>, StoreError> {
        let mut ends = vec![None; hits.len()];
        for (target, idx) in self.pipelines(hits.iter().enumerate()) {
            let mut pipe = redis::pipe();
            for &i in &idx {
                pipe.cmd("PTTL")
                    .arg(penalty::penalty_key(hits[i].key, &hits[i].quota));
            }
            let reply = checked_len(self.run(target, &pipe).await, idx.len())?;
            for (&i, value) in idx.iter().zip(&reply) {
                // -2: no such key; -1: no TTL (not Sluice's key); else milliseconds left.
                if let Value::Int(ms @ 1..) = value {
                    let left = u64::try_from(*ms).unwrap_or(0).saturating_mul(1_000);
                    ends[i] = Some(Timestamp::from_micros(now.micros().saturating_add(left)));
                }
            }
        }
        Ok(ends)
    }

    async fn record_penalties<'a>(
        &'a self,
        now: Timestamp,
        records: &'a [penalty::Record<'a>],
    ) -> Result<(), StoreError> {
        let hits: Vec<Hit<'_>> = records
            .iter()
            .map(|r| Hit {
                key: r.key,
                quota: r.quota,
                hits: 0,
            })
            .collect();
        for (target, idx) in self.pipelines(hits.iter().enumerate()) {
            let mut pipe = redis::pipe();
            for &i in &idx {
                let r = &records[i];
                let ms = r
                    .until
                    .micros()
                    .saturating_sub(now.micros())
                    .div_ceil(1_000);
                pipe.cmd("SET")
                    .arg(penalty::penalty_key(r.key, &r.quota))
                    .arg(1)
                    .arg("PX")
                    .arg(ms.max(1))
                    .ignore();
            }
            self.run(target, &pipe).await?;
        }
        Ok(())
    }
}
