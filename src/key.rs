//! Counter keys: the one writer of the bytes a counter is kept under, in memory, in Redis and
//! in memcached. No other module formats key bytes; they build this module's plain inputs
//! (prefix, domain, entries, window, algorithm) and call it.
//!
//! The Go service's keys come first, byte for byte (envoyproxy/ratelimit's
//! `src/limiter/cache_key.go`), so Go and Sluice instances can share a Redis or a memcached
//! during a migration:
//!
//! ```text
//! stem   = CACHE_KEY_PREFIX + domain + "_" + Σ(key + "_" + value + "_")
//! Go key = stem + window start       (seconds since the epoch, a multiple of the unit)
//! ```
//!
//! where a `share_threshold` wildcard puts its pattern in place of the value it matched. A
//! per-request limit (`descriptor.limit`) has the stem of a config limit on the same
//! descriptor, so both share one counter, as in Go; like Go, it takes no `share_threshold`
//! pattern. The memory store keeps the stem and holds the window in its counter word.
//!
//! Sluice's own keys carry what no Go key has, so none takes a Go limit's counter (only a
//! descriptor value ending in the same marker could, as Go's own keys can already meet when
//! values contain `_`):
//!
//! - a `rate_limits` list's further limits: stem + `#<i>_` for the `i`-th (from 1); the first
//!   limit's key is the stem ([`write_limit_keys`]);
//! - a window of several units (`unit_multiplier`): `x<N><UNIT>_` after the stem
//!   ([`window_stem`]);
//! - the other algorithms' state in Redis and memcached: that, then the algorithm's name
//!   ([`state_key`]);
//! - the peer cluster's write-behind to Redis: the prefix, `sluice:wb:{`, the stem without the
//!   prefix, `}:` and the counter's kind ([`write_behind_key`], [`write_behind_slots_key`]);
//! - a key memcached cannot store: `sluice:` and its SHA-256 in hex ([`memcached_key`]).
//!
//! A Rate Limit Quota Service bucket is named by its stem without the prefix
//! ([`write_bucket_key`]); it lives in Sluice's memory and its peers', never in a shared store.
//!
//! This module stands low in the crate: it names only [`Entry`], the limiter's window and
//! algorithm types and the clock's [`Timestamp`], so every layer (service, stores, cluster,
//! quota) can call it without importing another.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::ops::Range;

use crate::clock::Timestamp;
use crate::descriptor::Entry;
use crate::limiter::{Algorithm, CounterKind, Quota, Window, fixed_window};

/// Writes envoyproxy/ratelimit's cache key stem for a descriptor:
/// `prefix + domain + "_" + Σ(key + "_" + value + "_")`. The Go service's full key appends the
/// window start in seconds (`..._1200`, [`go_cache_key`]); the memory store keeps the window
/// in the counter word instead. `shared_values` substitutes a `share_threshold` wildcard
/// pattern for the request's value at those entry indexes.
pub fn write_counter_key(
    buf: &mut String,
    prefix: &str,
    domain: &str,
    entries: &[Entry],
    shared_values: &[(usize, &str)],
) {
    buf.push_str(prefix);
    buf.push_str(domain);
    buf.push('_');
    for (i, entry) in entries.iter().enumerate() {
        buf.push_str(&entry.key);
        buf.push('_');
        buf.push_str(key_value(i, entry, shared_values));
        buf.push('_');
    }
}

/// The length of the stem [`write_counter_key`] writes, without writing it.
pub(crate) fn counter_key_len(
    prefix: &str,
    domain: &str,
    entries: &[Entry],
    shared_values: &[(usize, &str)],
) -> usize {
    let entries: usize = entries
        .iter()
        .enumerate()
        .map(|(i, e)| e.key.len() + key_value(i, e, shared_values).len() + 2)
        .sum();
    prefix.len() + domain.len() + 1 + entries
}

/// The value entry `i` puts in its counter key: the request's, or its shared pattern.
fn key_value<'a>(i: usize, entry: &'a Entry, shared_values: &[(usize, &'a str)]) -> &'a str {
    shared_values
        .iter()
        .find(|(at, _)| *at == i)
        .map_or(entry.value.as_str(), |(_, pattern)| pattern)
}

/// Writes the keys of a descriptor's `limits` limits, given its stem, the last thing written
/// to `buf` (at `stem`), and passes each key's range to `push`, in order: the first limit's key
/// is the stem itself (the Go service's), the `i`-th further one of a `rate_limits` list the
/// stem then `#<i>_`. The stem's range is passed first whatever `limits` is.
pub(crate) fn write_limit_keys(
    buf: &mut String,
    stem: Range<usize>,
    limits: usize,
    mut push: impl FnMut(Range<usize>),
) {
    push(stem.clone());
    for i in 1..limits {
        let start = buf.len();
        buf.extend_from_within(stem.clone());
        // Writing to a String cannot fail.
        let _ = write!(buf, "#{i}_");
        push(start..buf.len());
    }
}

/// How many bytes [`write_limit_keys`] writes for a stem of `stem_len` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LimitKeysLen {
    /// The longest key, the last limit's: what SLUICE_MAX_KEY_BYTES caps.
    pub longest: usize,
    /// All the keys together, `limits` times the stem and every suffix.
    pub total: usize,
}

/// The lengths of a descriptor's `limits` keys ([`write_limit_keys`]), without writing them.
pub(crate) fn limit_keys_len(stem_len: usize, limits: usize) -> LimitKeysLen {
    LimitKeysLen {
        longest: stem_len + (1..limits).last().map_or(0, limit_suffix_len),
        total: stem_len * limits + (1..limits).map(limit_suffix_len).sum::<usize>(),
    }
}

/// The length of `#<i>_`, which the `i`-th further limit of a `rate_limits` list adds to its
/// descriptor's stem.
fn limit_suffix_len(i: usize) -> usize {
    i.checked_ilog10().unwrap_or(0) as usize + 3
}

/// envoyproxy/ratelimit's full cache key: the stem followed by the start of the window that
/// contains `now`, in seconds since the epoch. A store that shares keys with Go instances
/// (Redis, memcached) uses exactly these bytes, and the local over-limit cache keys by them.
///
/// A window of several units (`unit_multiplier`, which Go does not have) puts `x<N><UNIT>_`
/// between the stem and the start (`d_k_v_x5MINUTE_1700000100`), so it never takes the key of
/// a Go limit on the same descriptor.
pub fn go_cache_key(stem: &str, now: Timestamp, window: impl Into<Window>) -> String {
    let window = window.into();
    let start = fixed_window::window_start(now.secs(), window);
    format!("{}{start}", window_stem(stem, window))
}

/// The stem a window's Redis and memcached keys start with: `stem` for one unit (the Go
/// service's), else `stem` then `x<N><UNIT>_` ([`go_cache_key`]; [`state_key`] too); a window
/// on a zone's calendar (`time_zone`) then adds `tz<zone>_`, or `tz<zone>+<week_start>_`
/// (`d_k_v_tzAsia/Tokyo_1700000000`), so its keys never meet an epoch window's. The Go
/// service's calendar month (USE_CALENDAR_MONTH_RATE_LIMIT) adds nothing: its keys are Go's.
pub(crate) fn window_stem(stem: &str, window: Window) -> Cow<'_, str> {
    if window.is_plain() && !window.calendar.is_zoned() {
        return stem.into();
    }
    let mut out = stem.to_owned();
    if !window.is_plain() {
        let _ = write!(out, "x{}{}_", window.multiplier, window.unit.name());
    }
    if window.calendar.is_zoned() {
        out.push_str("tz");
        out.push_str(window.calendar.name());
        if let Some(day) = window.calendar.week_start() {
            let _ = write!(out, "+{day}");
        }
        out.push('_');
    }
    out.into()
}

/// The key a remote store (Redis, memcached) keeps a non-fixed algorithm's state under: the
/// stem and the algorithm's name, and for a window of several units the same marker as
/// [`go_cache_key`]'s (`d_k_v_sliding_window`, `d_k_v_x5MINUTE_token_bucket`). No Go instance
/// reads these keys: the Go service has only fixed windows.
pub fn state_key(stem: &str, quota: &Quota) -> String {
    format!(
        "{}{}",
        window_stem(stem, quota.window()),
        quota.algorithm.name()
    )
}

/// The key a remote store (Redis, memcached) keeps the counter of `stem` and `quota` under at
/// `now`: a fixed window's Go key ([`go_cache_key`]), else its state key ([`state_key`]).
pub(crate) fn remote_key(stem: &str, quota: &Quota, now: Timestamp) -> String {
    if quota.algorithm == Algorithm::FixedWindow {
        go_cache_key(stem, now, quota.window())
    } else {
        state_key(stem, quota)
    }
}

/// The longest key memcached stores (the Go service's client, gomemcache, refuses longer ones).
pub(crate) const MEMCACHED_MAX_KEY_BYTES: usize = 250;

/// Whether memcached can store `key` as it is: at most [`MEMCACHED_MAX_KEY_BYTES`], and no byte
/// that is a space, a control character or DEL (the rule of the Go service's client,
/// gomemcache's `legalKey`; bytes above 0x7f, so UTF-8, are legal).
pub(crate) fn memcached_legal(key: &str) -> bool {
    key.len() <= MEMCACHED_MAX_KEY_BYTES && key.bytes().all(|b| b > b' ' && b != 0x7f)
}

/// The key memcached stores for `key`: itself when memcached can store it
/// ([`memcached_legal`]), else `sluice:` and its SHA-256 in hex (71 bytes), the same on every
/// replica. The Go service fails such a key open; Sluice still counts it.
pub fn memcached_key(key: String) -> String {
    if memcached_legal(&key) {
        return key;
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sluice:");
    for b in digest.as_ref() {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The Redis key the peer cluster writes a counter behind to (SLUICE_PEER_WRITE_BEHIND):
/// `prefix + "sluice:wb:{" + stem without the prefix + "}:" + kind`, the kind being
/// `fw:<window s>:<window index>`, `sw:<window s>:<window index>` or `gcra` (`window` is
/// ignored for buckets); a calendar window's length is followed by `@` and its calendar
/// (`fw:86400@Asia/Tokyo:20600`). The stem is a hash tag, so one descriptor's keys share a Redis
/// Cluster slot; none can be taken for a Go key (`prefix + domain_...`).
pub(crate) fn write_behind_key(prefix: &str, stem: &str, kind: CounterKind, window: u64) -> String {
    let mut key = write_behind_head(prefix, stem);
    // A calendar window's indexes count local units, not lengths since the epoch.
    let at = |w: Window| match w.calendar.wire() {
        c if c.is_empty() => c,
        c => format!("@{c}"),
    };
    // Writing to a String cannot fail.
    match kind {
        CounterKind::Fixed(w) => drop(write!(key, "fw:{}{}:{window}", w.secs(), at(w))),
        CounterKind::Sliding(w) => drop(write!(key, "sw:{}{}:{window}", w.secs(), at(w))),
        CounterKind::Bucket => key.push_str("gcra"),
    }
    key
}

/// The Redis keys replicas share their runtime limits through (`crate::runtime_limits::redis`):
/// the hash of every limit and the stream of changes, in one Redis Cluster hash slot.
pub(crate) fn runtime_limit_keys(prefix: &str) -> (String, String) {
    (
        format!("{prefix}sluice:{{runtime}}:limits"),
        format!("{prefix}sluice:{{runtime}}:log"),
    )
}

/// The Redis key the peer cluster writes a concurrency limit's slots behind to:
/// `prefix + "sluice:wb:{" + stem without the prefix + "}:cc:" + window seconds`.
pub(crate) fn write_behind_slots_key(prefix: &str, stem: &str, window: Window) -> String {
    let mut key = write_behind_head(prefix, stem);
    // Writing to a String cannot fail.
    let _ = write!(key, "cc:{}", window.secs());
    key
}

/// What every write-behind key starts with: `prefix + "sluice:wb:{" + stem without the prefix
/// + "}:"`.
fn write_behind_head(prefix: &str, stem: &str) -> String {
    let bare = stem.strip_prefix(prefix).unwrap_or(stem);
    format!("{prefix}sluice:wb:{{{bare}}}:")
}

/// Writes the key of a Rate Limit Quota Service bucket: the stem of the descriptor its bucket
/// id maps to, without CACHE_KEY_PREFIX (buckets live in Sluice's memory and its peers', in no
/// store a Go instance shares). It names the bucket in metrics and `/debug/rlqs`, and places
/// it on the peers' ring.
pub(crate) fn write_bucket_key(
    buf: &mut String,
    domain: &str,
    entries: &[Entry],
    shared_values: &[(usize, &str)],
) {
    write_counter_key(buf, "", domain, entries, shared_values);
}

/// The length of the key [`write_bucket_key`] writes for a bucket id with no shared values.
pub(crate) fn bucket_key_len(domain: &str, entries: &[Entry]) -> usize {
    counter_key_len("", domain, entries, &[])
}

#[cfg(test)]
mod tests;
