//! A compiled limit's cached link to its stats counters.
//!
//! The counters belong to telemetry, which sits beside the decision and outside config, so the
//! slot holds them as `Any`: config never names a telemetry type, and telemetry, which fills
//! the slot on the first request that counts against the limit, reads back its own type.

use std::any::Any;
use std::sync::{Arc, OnceLock};

/// What a filled slot links to, as its filler put it there.
pub(crate) type StatsLink = Arc<dyn Any + Send + Sync>;

/// Empty until the first request that counts against its limit. It remembers which registry
/// filled it (an id the registry chooses), so a config shared by two services (tests) never
/// mixes their counters.
#[derive(Default)]
pub struct StatsSlot(OnceLock<(u64, StatsLink)>);

impl StatsSlot {
    /// The link registry `owner` put here, if it is the one that filled the slot.
    pub fn get(&self, owner: u64) -> Option<&StatsLink> {
        match self.0.get() {
            Some((id, link)) if *id == owner => Some(link),
            _ => None,
        }
    }

    /// Fills the slot, unless it is already filled (then nothing changes).
    pub fn fill(&self, owner: u64, link: StatsLink) {
        // Another thread may have filled it meanwhile; both found the same counters.
        let _ = self.0.set((owner, link));
    }
}

impl Clone for StatsSlot {
    fn clone(&self) -> Self {
        StatsSlot(self.0.clone())
    }
}

impl std::fmt::Debug for StatsSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StatsSlot")
    }
}

/// A cache, not part of a limit's value: two limits are equal whatever their slots hold.
impl PartialEq for StatsSlot {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
