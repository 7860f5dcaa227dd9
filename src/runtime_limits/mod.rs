//! Where a runtime limit change goes once it applies on this node (docs/runtime-limits.md): to
//! SLUICE_RUNTIME_LIMITS_PATH ([`crate::config::runtime::file`]), to every peer of a peer
//! cluster (`cluster::runtime_peers`, over the peer protocol) and to the replicas sharing Redis
//! ([`redis`]). Each is a [`Sink`]; the runtime limits API waits for all of them before it
//! answers, and knows none of them by name. The limits themselves (the layer over the YAML's
//! tree, its stamps and digests) are [`crate::config::runtime`].

pub mod redis;

use std::future::Future;
use std::pin::Pin;

use crate::config::runtime::Replicated;
use crate::config::runtime::file::{SaveError, Saver};
use crate::store::StoreError;

/// A change's future answer from a [`Sink`].
pub type Settling<'a> = Pin<Box<dyn Future<Output = Result<Vec<String>, NotSettled>> + Send + 'a>>;

/// Where a change goes once applied here. `Ok` once the change (this node's change number
/// `sequence`) is there, with the peers it did not reach (which the anti-entropy pass brings it
/// to); `Err` says why not.
pub(crate) trait Sink: Send + Sync {
    fn settled<'a>(&'a self, sequence: u64, change: &'a Replicated) -> Settling<'a>;

    /// The anti-entropy pass's counts, for a peer cluster's sink.
    fn sync_counts(&self) -> Option<SyncCounts> {
        None
    }
}

/// Why a change applied here did not reach a [`Sink`] before the API answered.
#[derive(Debug, thiserror::Error)]
pub enum NotSettled {
    /// SLUICE_RUNTIME_LIMITS_PATH did not save it.
    #[error(transparent)]
    Unsaved(#[from] SaveError),
    /// Redis did not take it.
    #[error("Redis did not take it: {0}")]
    Redis(#[from] StoreError),
}

/// What a peer cluster's anti-entropy pass and pushes did, for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncCounts {
    /// Comparisons that found the same digest.
    pub same: u64,
    /// Comparisons that found another digest, and reconciled.
    pub differed: u64,
    /// Comparisons or reconciliations that failed (the peer did not answer in time).
    pub failed: u64,
    /// Pushes a peer did not take (each retried by the next pass).
    pub missed_pushes: u64,
}

/// The file has the change before the API answers: a change is answered once it is on disk.
impl Sink for Saver {
    fn settled<'a>(&'a self, sequence: u64, _: &'a Replicated) -> Settling<'a> {
        Box::pin(async move {
            Saver::settled(self, sequence).await?;
            Ok(Vec::new())
        })
    }
}
