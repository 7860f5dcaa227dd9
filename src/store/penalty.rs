//! `penalty_seconds` (issue 52) in every store: once a limit refuses a key, the key is refused
//! for the penalty's length from that refusal, across its window's reset.
//!
//! One algorithm for every backend ([`apply`]), over what each keeps of penalties
//! ([`Penalized`]): the memory store a table beside its counters, Redis a key with a TTL beside
//! the Go key ([`penalty_key`]), memcached the same key with an expiry. A call's hits whose
//! limit has a penalty first ask when their key's penalty ends (one round trip for all of
//! them); a key in its penalty is answered refused, its counter neither charged nor read; the
//! other hits are charged as always, and a refusal among them starts its key's penalty. In the
//! peer cluster the key's owner's store does this: forwarded hits carry the penalty, and a
//! limit with a penalty is never leased.

use std::future::Future;

use crate::clock::Timestamp;
use crate::limiter::{Decision, Quota};
use crate::store::{Hit, StoreError};

/// A penalty to keep: `key` (a hit's key stem) refused until `until`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Record<'a> {
    pub key: &'a str,
    pub quota: Quota,
    pub until: Timestamp,
}

/// The key a remote store (Redis, memcached) keeps a counter's penalty under: the counter's
/// window stem and `sluice_penalty` (`d_k_v_sluice_penalty`). No Go instance reads it.
pub(crate) fn penalty_key(stem: &str, quota: &Quota) -> String {
    format!(
        "{}sluice_penalty",
        crate::key::window_stem(stem, quota.window())
    )
}

/// A store that keeps penalties beside its counters.
pub(crate) trait Penalized: Sync {
    /// Charges `hits` as the store does without penalties.
    fn apply_counters<'a>(
        &'a self,
        now: Timestamp,
        hits: &'a [Hit<'a>],
        out: &'a mut Vec<Decision>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// When the penalty of each hit's key ends, in order: `None` where none is in force at
    /// `now`.
    fn penalty_ends<'a>(
        &'a self,
        now: Timestamp,
        hits: &'a [Hit<'a>],
    ) -> impl Future<Output = Result<Vec<Option<Timestamp>>, StoreError>> + Send + 'a;

    /// Keeps each record's penalty until its time (replacing one in force).
    fn record_penalties<'a>(
        &'a self,
        now: Timestamp,
        records: &'a [Record<'a>],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;
}

/// The refusal of a hit whose key is in its penalty until `until`.
pub fn penalized(hit: &Hit<'_>, now: Timestamp, until: Timestamp) -> Decision {
    let micros = until.micros().saturating_sub(now.micros());
    Decision {
        count_after: 0,
        count_before: 0,
        over: hit.hits > 0,
        remaining: 0,
        reset_after_secs: micros.div_ceil(1_000_000).max(1),
        expired: 0,
        penalized: true,
    }
}

/// When a penalty of `secs` started at `now` ends.
fn end_of(now: Timestamp, secs: u32) -> Timestamp {
    Timestamp::from_micros(now.micros().saturating_add(u64::from(secs) * 1_000_000))
}

/// [`crate::store::CounterStore::apply`] with penalties, for a store that keeps them.
pub(crate) async fn apply<'a, S: Penalized>(
    store: &'a S,
    now: Timestamp,
    hits: &'a [Hit<'a>],
    out: &'a mut Vec<Decision>,
) -> Result<(), StoreError> {
    if hits.iter().all(|h| h.quota.penalty.is_none()) {
        return store.apply_counters(now, hits, out).await;
    }
    let with: Vec<Hit<'a>> = hits
        .iter()
        .filter(|h| h.quota.penalty.is_some())
        .copied()
        .collect();
    let mut ends = store.penalty_ends(now, &with).await?.into_iter();
    let held: Vec<Option<Timestamp>> = hits
        .iter()
        .map(|h| match h.quota.penalty {
            // At most the limit's own length from now: a penalty kept under a longer
            // `penalty_seconds` (since shortened), or by a clock since set back, ends sooner.
            Some(p) => ends
                .next()
                .flatten()
                .filter(|&end| end > now)
                .map(|end| end.min(end_of(now, p.secs.get()))),
            None => None,
        })
        .collect();
    let free: Vec<Hit<'a>> = hits
        .iter()
        .zip(&held)
        .filter(|(_, end)| end.is_none())
        .map(|(h, _)| *h)
        .collect();
    let mut counted = Vec::with_capacity(free.len());
    if !free.is_empty() {
        store.apply_counters(now, &free, &mut counted).await?;
    }
    if counted.len() != free.len() {
        return Err(StoreError::BadReply {
            expected: free.len(),
            got: counted.len(),
        });
    }
    let mut counted = counted.into_iter();
    let mut records = Vec::new();
    for (hit, end) in hits.iter().zip(held) {
        let decision = match (end, hit.quota.penalty) {
            (Some(end), Some(p)) if p.extends && hit.hits > 0 => {
                let until = end_of(now, p.secs.get());
                records.push(record(hit, until));
                penalized(hit, now, until.max(end))
            }
            (Some(end), _) => penalized(hit, now, end),
            (None, penalty) => {
                let mut d = counted.next().unwrap_or_default();
                if let Some(p) = penalty.filter(|_| d.over) {
                    records.push(record(hit, end_of(now, p.secs.get())));
                    d.reset_after_secs = d.reset_after_secs.max(u64::from(p.secs.get()));
                }
                d
            }
        };
        out.push(decision);
    }
    if !records.is_empty() {
        // The decisions stand: a penalty that could not be kept leaves its key refused by its
        // counter alone, as without a penalty.
        if let Err(e) = store.record_penalties(now, &records).await {
            tracing::warn!(error = %e, "cannot keep a penalty (penalty_seconds)");
        }
    }
    Ok(())
}

fn record<'a>(hit: &Hit<'a>, until: Timestamp) -> Record<'a> {
    Record {
        key: hit.key,
        quota: hit.quota,
        until,
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;
    use crate::limiter::{Algorithm, Penalty, Unit};
    use crate::store::{CounterStore, MemoryStore};

    /// 3 per second with a penalty of 3 s (a leaky bucket, as nginx's `limit_req`, admits one
    /// request beyond its burst at once: burst 2 for 3 at once).
    fn quota(algorithm: Algorithm, extends: bool) -> Quota {
        Quota {
            penalty: Some(Penalty {
                secs: NonZeroU32::new(3).unwrap(),
                extends,
            }),
            burst: (algorithm == Algorithm::LeakyBucket).then(|| NonZeroU32::new(2).unwrap()),
            ..Quota::fixed(3, Unit::Second).with_algorithm(algorithm)
        }
    }

    /// One request of one hit at `at_ms` milliseconds.
    async fn ask(store: &MemoryStore, quota: Quota, at_ms: u64) -> Decision {
        let hits = [Hit {
            key: "d_k_v_",
            quota,
            hits: 1,
        }];
        let mut out = Vec::new();
        let now = Timestamp::from_micros(1_000_000_000_000 + at_ms * 1_000);
        store.apply(now, &hits, &mut out).await.unwrap();
        out[0]
    }

    /// The case, on every algorithm: 3 per second with a penalty of 3 s refuses the
    /// key in the next second after its fourth request, and admits it 3 s after that refusal.
    #[tokio::test]
    async fn a_refused_key_stays_refused_for_the_penalty_and_then_is_admitted() {
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket,
            Algorithm::LeakyBucket,
        ] {
            let store = MemoryStore::new(100);
            let q = quota(algorithm, false);
            for at in [0, 10, 20] {
                assert!(!ask(&store, q, at).await.over, "{algorithm:?} at {at} ms");
            }
            let fourth = ask(&store, q, 30).await;
            assert!(
                fourth.over && !fourth.penalized,
                "{algorithm:?}: {fourth:?}"
            );
            assert_eq!(fourth.reset_after_secs, 3, "{algorithm:?}");
            // The next second, and the one after: refused, uncounted, the penalty's end said.
            let next = ask(&store, q, 1_500).await;
            assert!(next.over && next.penalized, "{algorithm:?}: {next:?}");
            assert_eq!(next.reset_after_secs, 2, "{algorithm:?}");
            assert!(ask(&store, q, 2_999).await.penalized, "{algorithm:?}");
            // 3 s after the refusal: admitted, the requests during the penalty not counted.
            let after = ask(&store, q, 3_031).await;
            assert!(!after.over && !after.penalized, "{algorithm:?}: {after:?}");
        }
    }

    #[tokio::test]
    async fn with_penalty_extends_a_request_during_the_penalty_restarts_it() {
        let store = MemoryStore::new(100);
        let q = quota(Algorithm::FixedWindow, true);
        for at in [0, 10, 20] {
            ask(&store, q, at).await;
        }
        assert!(ask(&store, q, 30).await.over);
        let during = ask(&store, q, 2_000).await;
        assert!(during.penalized);
        assert_eq!(during.reset_after_secs, 3);
        // Without the request at 2 s it would have ended at 3.03 s.
        assert!(ask(&store, q, 4_000).await.penalized);
        assert!(!ask(&store, q, 7_001).await.over);
    }

    #[tokio::test]
    async fn penalties_are_swept_once_over() {
        let store = MemoryStore::new(100);
        let q = quota(Algorithm::FixedWindow, false);
        for at in [0, 10, 20, 30] {
            ask(&store, q, at).await;
        }
        assert_eq!(store.penalties_held(), 1);
        store.sweep(Timestamp::from_micros(1_000_000_000_000 + 2_000_000));
        assert_eq!(store.penalties_held(), 1);
        store.sweep(Timestamp::from_micros(1_000_000_000_000 + 3_031_000));
        assert_eq!(store.penalties_held(), 0);
    }
}
