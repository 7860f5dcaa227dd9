//! Counter stores: one trait, [`CounterStore`], that every backend implements.
//!
//! A store owns the counter state and applies one request's hits atomically per counter, using
//! the pure algorithms in [`crate::limiter`]. It knows nothing about descriptors or config: the
//! service hands it finished counter keys, limits and hits.

pub mod memory;

use std::future::Future;

use crate::clock::Timestamp;
use crate::limiter::Unit;
use crate::limiter::fixed_window::Decision;

pub use memory::MemoryStore;

/// One counter to charge: the key stem (envoyproxy/ratelimit's cache key without the trailing
/// window start, see [`crate::service::write_counter_key`]), the window unit, the limit and the
/// hits to add.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hit<'a> {
    pub key: &'a str,
    pub unit: Unit,
    pub limit: u32,
    pub hits: u64,
}

/// Why a store could not answer. Every variant is classified, so `api` can map it to a status
/// and operators can tell a full store from a broken backend.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The in-memory store holds its maximum number of live counters and this request needs a
    /// new one. Transient: the sweeper frees expired windows.
    #[error(
        "counter store is full: {max} live counters (SLUICE_MAX_COUNTERS); new counters are refused until expired windows are swept"
    )]
    Full { max: usize },
    /// The backend answered a different number of decisions than hits were sent: a bug in
    /// the backend. Permanent.
    #[error("counter store answered {got} decisions for {expected} hits")]
    BadReply { expected: usize, got: usize },
}

impl StoreError {
    /// Transient errors may succeed if retried later; permanent ones will not.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Full { .. } => true,
            StoreError::BadReply { .. } => false,
        }
    }
}

/// A backend that keeps counters.
pub trait CounterStore: Send + Sync + 'static {
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
}
