//! How a hit reaches its counter: one type per routing mode, each holding only what it uses,
//! behind [`Route`]. [`Mode`] is SLUICE_CLUSTER_MODE's choice; [`Minority`] decides for every
//! mode while this node reaches no majority of its peers.
//!
//! - [`Forward`] (`forward`): each hit applied on its key's owner, retried once on the next
//!   owners for the hits whose owner failed.
//! - [`Divided`] (`divided`, Cortex's global limiter): each node enforces its share of the
//!   limit locally; concurrency limits still go to their owners.
//! - [`Leased`] (`lease`): each hit decided from this node's lease on its key, acquired from
//!   the key's owner ([`super::lease`] is the logic; `leased::driver` makes the calls and runs
//!   the renewals and the sweep).
//! - [`Minority`] (no split brain): alone, within each limit's safe capacity.

mod divided;
mod forward;
mod leased;
mod minority;

pub(super) use divided::Divided;
pub use divided::node_limit;
pub(super) use forward::Forward;
pub(super) use leased::{Leased, Leasing};
pub(super) use minority::Minority;

use super::members::Members;
use super::peer::Op;
use crate::clock::Timestamp;
use crate::limiter::Decision;
use crate::store::{Hit, StoreError};

/// A way of taking hits to their counters.
pub(super) trait Route {
    /// Applies, refunds or resets (`op`) `hits` at `now`, with `members` as this call sees
    /// them: one decision per hit into `out` for a charge or a refund, none for a reset.
    async fn route(
        &self,
        members: &Members,
        now: Timestamp,
        hits: &[Hit<'_>],
        op: Op,
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError>;
}

/// SLUICE_CLUSTER_MODE's routing.
pub(super) enum Mode {
    Forward(Forward),
    Divided(Divided),
    Lease(Leased),
}

impl Route for Mode {
    async fn route(
        &self,
        members: &Members,
        now: Timestamp,
        hits: &[Hit<'_>],
        op: Op,
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        match self {
            Mode::Forward(r) => r.route(members, now, hits, op, out).await,
            Mode::Divided(r) => r.route(members, now, hits, op, out).await,
            Mode::Lease(r) => r.route(members, now, hits, op, out).await,
        }
    }
}
