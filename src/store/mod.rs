//! Counter stores: one trait, [`CounterStore`], that every backend implements.
//!
//! A store owns the counter state and applies one request's hits atomically per counter, using
//! the pure algorithms in [`crate::limiter`]. It knows nothing about descriptors or config: the
//! service hands it finished counter keys, limits and hits, and the keys a backend writes are
//! [`crate::key`]'s.
//!
//! Every backend is held to one contract suite (`tests/support/src/store_contract/`), run on the
//! memory store and an in-process three-node cluster (`tests/stores.rs`) and on Redis
//! (`integration/redis.rs`): for the same calls, each answers as the limiter's functions do.

pub mod allowance;
mod breaker;
mod go_fixed;
pub mod memcache;
pub mod memory;
pub mod penalty;
pub mod redis;
mod redis_client;
mod redis_sentinel;
mod redis_target;

use std::future::Future;
use std::sync::Arc;

use crate::clock::Timestamp;
use crate::limiter::{Decision, Quota};

pub use memcache::MemcacheStore;
pub use memory::{MemoryLimits, MemoryStore};
pub use redis::{RedisLink, RedisStore};

/// One counter to charge: the key stem (envoyproxy/ratelimit's cache key without the trailing
/// window start, see [`crate::key::write_counter_key`]), the quota it enforces (rate,
/// unit, algorithm) and the hits to add. A remote store's key for it is
/// [`crate::key::remote_key`]'s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hit<'a> {
    pub key: &'a str,
    pub quota: Quota,
    pub hits: u64,
}

/// Why a store could not answer, so that `api` can map it to a status and operators can tell a
/// full store from a broken backend.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The in-memory store holds its maximum number of live counters and this request needs a
    /// new one; the sweeper frees expired windows.
    #[error(
        "counter store is full: {max} live counters (SLUICE_MAX_COUNTERS); new counters are refused until expired windows are swept"
    )]
    Full { max: usize },
    /// The in-memory store's counters take up its byte budget (each its key plus a measured
    /// overhead) and this request needs a new one, as [`StoreError::Full`].
    #[error(
        "counter store is full: its counters take {max} bytes (SLUICE_MAX_COUNTER_BYTES; each counts its key plus {overhead} bytes); new counters are refused until expired windows are swept",
        overhead = memory::COUNTER_OVERHEAD_BYTES
    )]
    FullBytes { max: usize },
    /// A remote backend (Redis) failed or did not answer in time.
    #[error("backend error: {message}")]
    Backend { message: String },
    /// The peers that own some of the counters failed, each owner tried in turn (the cluster's
    /// forwards and lease asks). Said as a [`StoreError::Backend`] is, so it is answered and
    /// counted as one; `source` is the last failed call's error, the cluster's `PeerError`
    /// (a timeout, an unreachable peer, a refusal with its status, a malformed answer).
    #[error("backend error: {message}")]
    Peer {
        message: &'static str,
        source: Cause,
    },
    /// The backend answered a different number of decisions than hits were sent: a bug in
    /// the backend.
    #[error("counter store answered {got} decisions for {expected} hits")]
    BadReply { expected: usize, got: usize },
}

/// The error beneath a [`StoreError`] from a layer the store does not name (the peer cluster
/// stands above `store`), shared so that the `StoreError` stays `Clone`. It derefs to that
/// error, which is therefore the `StoreError`'s `source()`, whose type `downcast_ref` finds.
/// Two are equal when they say the same thing: errors have no equality of their own.
#[derive(Clone)]
pub struct Cause(Arc<dyn std::error::Error + Send + Sync>);

impl Cause {
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Cause(Arc::new(error))
    }
}

impl std::ops::Deref for Cause {
    type Target = dyn std::error::Error + Send + Sync;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl std::fmt::Debug for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&*self.0, f)
    }
}

impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl Eq for Cause {}

/// How a traced call's backend span is named and described.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceBackend {
    pub span_name: &'static str,
    pub attributes: &'static [(&'static str, &'static str)],
}

/// A backend that keeps counters.
pub trait CounterStore: Send + Sync + 'static {
    /// The CLIENT span recorded around [`CounterStore::apply`] in a traced call; `None` (the
    /// default) for a store whose calls cost too little to be worth a span, such as memory.
    fn trace_backend(&self) -> Option<TraceBackend> {
        None
    }

    /// Charges every hit at `now` and pushes one decision per hit, in order, onto `out`.
    ///
    /// Either every hit is applied or (on error) none is, so a failed request never leaves
    /// half its counters charged.
    fn apply<'a>(
        &'a self,
        now: Timestamp,
        hits: &'a [Hit<'a>],
        out: &'a mut Vec<Decision>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// Takes each hit's `hits` off its counter at `now` (a refund), and pushes one decision per
    /// hit, in order, onto `out`: a peek at the counter after the refund, as `apply` answers one
    /// of 0 hits. One meaning for every algorithm ([`crate::limiter::counter::refund`]): a
    /// window's current count goes down, floored at 0; a bucket gets tokens back, never more
    /// than at rest. Which hits to give back is the caller's choice: the service refunds what a
    /// refused request's other limits admitted (fixed windows and `charge_refused` limits keep
    /// theirs, as the Go service keeps every hit) and the negative hits a client sends.
    fn refund<'a>(
        &'a self,
        now: Timestamp,
        hits: &'a [Hit<'a>],
        out: &'a mut Vec<Decision>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// Whether this store counts every refused hit of `quota`, so that a refund sent for a
    /// refused request (Envoy sends a negative hit at a request's end whether or not it was
    /// admitted) gives back only what the request took. [`Quota::charges_refused`] by default:
    /// a fixed window counts every hit, the others with `charge_refused`. A store that holds
    /// some refused hits back (Redis and memcached with the local over-limit cache or
    /// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, leases) says so here.
    fn counts_refused(&self, quota: &Quota) -> bool {
        quota.charges_refused()
    }

    /// Forgets the counters of `hits` (their `hits` are ignored), as if they had never been
    /// charged: the counter admin's reset. A store that cannot says so with an error.
    fn reset<'a>(
        &'a self,
        now: Timestamp,
        hits: &'a [Hit<'a>],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        let _ = (now, hits);
        std::future::ready(Err(StoreError::Backend {
            message: "this counter store cannot reset counters".to_owned(),
        }))
    }
}
