//! Write-behind of concurrency limits' slots (`algorithm: concurrency`,
//! [`crate::limiter::concurrency`]): the owner writes each changed counter's slots to Redis at
//! the next flush, and a node taking a key over loads them before its first answer, as for the
//! other counters (see the parent module) but with the slots' own form:
//!
//! - **Key.** `CACHE_KEY_PREFIX + "sluice:wb:{" + stem + "}:cc:" + window seconds`
//!   ([`crate::key::write_behind_slots_key`]), a string holding [`Slots::text`] (the debt, its
//!   end, each slot's expiry in µs).
//! - **Write.** `SET key text PX ttl`, the TTL ending [`GRACE_MS`] after its last slot or its
//!   debt; `DEL` when it holds nothing. The owner's slots are the counter (a refund frees
//!   one), so a write replaces what Redis holds rather than raising it: while two nodes
//!   disagree about a key's owner, the last write wins, for at most a window.
//! - **Load.** When the horizon (a window back) saw a ring change, or another node owns the
//!   key, `GET` it and merge ([`Slots::merge_max`]: the more slots, never counted twice), so a
//!   lost owner's slots are still held, and still free themselves when their window ends.

use std::sync::atomic::Ordering;

use redis::Value;

use super::{Durable, GRACE_MS};
use crate::clock::Timestamp;
use crate::key::write_behind_slots_key;
use crate::limiter::concurrency::Slots;
use crate::limiter::{Algorithm, Quota};
use crate::store::Hit;

impl Durable {
    /// Marks a concurrency counter changed. No I/O.
    pub(super) fn mark_slots_dirty(&self, hit: &Hit<'_>) {
        if !self.dirty_slots.contains_key(hit.key) {
            self.dirty_slots.insert(Box::from(hit.key), hit.quota);
        }
    }

    /// Loads, before they are applied, the slots of concurrency hits this node may have taken
    /// over: those it holds nothing for, when a ring change came within a window (`changed`)
    /// or `elsewhere(key)` says another node owns the key. Never fails.
    pub(super) async fn take_over_slots(
        &self,
        now: Timestamp,
        hits: &[Hit<'_>],
        changed: Timestamp,
        elsewhere: &impl Fn(&str) -> bool,
    ) {
        let due: Vec<&Hit<'_>> = hits
            .iter()
            .filter(|h| h.quota.algorithm == Algorithm::Concurrency)
            .filter(|h| self.local.slots(&h.quota, h.key, now).is_none())
            .filter(|h| {
                let window_us = h.quota.window().secs().saturating_mul(1_000_000);
                changed.micros() >= now.micros().saturating_sub(window_us) || elsewhere(h.key)
            })
            .collect();
        if due.is_empty() {
            return;
        }
        if now.micros() < self.redis_down_until.load(Ordering::Relaxed) {
            let skipped = due.len() as u64;
            self.stats
                .loads_skipped
                .fetch_add(skipped, Ordering::Relaxed);
            return;
        }
        futures_util::future::join_all(due.into_iter().map(|h| self.load_slots(h, now))).await;
    }

    async fn load_slots(&self, hit: &Hit<'_>, now: Timestamp) {
        self.stats.loads.fetch_add(1, Ordering::Relaxed);
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg(write_behind_slots_key(
            &self.prefix,
            hit.key,
            hit.quota.window(),
        ));
        let reply = tokio::time::timeout(self.load_timeout, self.redis.run(&pipe)).await;
        let reply = match reply.unwrap_or_else(|_| Err(self.load_too_slow())) {
            Ok(reply) => reply,
            Err(e) => {
                self.stats.load_failures.fetch_add(1, Ordering::Relaxed);
                self.redis_failed(now, "take-over load", &e);
                return;
            }
        };
        let Some(Value::BulkString(text)) = reply.first() else {
            return;
        };
        let Some(slots) = std::str::from_utf8(text).ok().and_then(Slots::parse) else {
            return;
        };
        self.stats.loads_found.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.local.merge_slots(&hit.quota, hit.key, &slots) {
            tracing::debug!(error = %e, "cannot keep loaded slots");
        }
    }

    /// Writes every concurrency counter changed since the last flush, one call each
    /// (concurrently; each names one key, so any Redis Cluster node takes it); returns how
    /// many were written. A failed write is marked dirty again for the next flush.
    pub(super) async fn flush_slots(&self, now: Timestamp) -> usize {
        let mut taken: Vec<(Box<str>, Quota)> = Vec::new();
        self.dirty_slots.retain(|stem, quota| {
            taken.push((stem.clone(), *quota));
            false
        });
        let sends = taken.iter().map(|(stem, quota)| async move {
            let key = write_behind_slots_key(&self.prefix, stem, quota.window());
            let mut pipe = redis::pipe();
            let held = self.local.slots(quota, stem, now);
            match held.filter(|s| !s.is_stale(now.micros())) {
                Some(s) => {
                    let ttl_ms = (s.expires_at() - now.micros()).div_ceil(1_000) + GRACE_MS;
                    pipe.cmd("SET")
                        .arg(&key)
                        .arg(s.text())
                        .arg("PX")
                        .arg(ttl_ms);
                }
                None => {
                    pipe.cmd("DEL").arg(&key);
                }
            }
            self.redis.run(&pipe).await
        });
        let results = futures_util::future::join_all(sends).await;
        let mut written = 0;
        for ((stem, quota), result) in taken.into_iter().zip(results) {
            match result {
                Ok(_) => written += 1,
                Err(e) => {
                    self.stats.flush_failures.fetch_add(1, Ordering::Relaxed);
                    self.redis_failed(now, "flush", &e);
                    self.dirty_slots.entry(stem).or_insert(quota);
                }
            }
        }
        written
    }
}
