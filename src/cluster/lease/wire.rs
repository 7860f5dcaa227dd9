//! The Lease call's wire form (`sluice.peer.v1.Peer/Lease`, [`crate::cluster::peer`]): an
//! [`Ask`] as a [`LeaseAsk`] (a [`PeerHit`] naming the key, its quota and the hits wanted now,
//! then what the node used, keeps and demands) and a [`Grant`] as a [`LeaseGrant`]. The owner
//! refuses a call past [`MAX_LEASE_ASKS`], an ask without its key, or an algorithm or unit
//! number it does not know (INVALID_ARGUMENT), before answering any ask.

use std::num::NonZeroU32;

use super::free::Recall;
use super::{Ask, Grant};
use crate::cluster::peer::{FreeRecall, LeaseAsk, LeaseGrant, LeaseRequest, PeerHit};
use crate::limiter::Quota;
use crate::store::Hit;

/// The most asks one Lease call carries; a renewal of more keys takes several calls.
pub const MAX_LEASE_ASKS: usize = 2048;

impl LeaseRequest {
    /// Each ask's key and ask, as the owner takes them, the keys moved out of the call (no copy
    /// per key); a call past [`MAX_LEASE_ASKS`], or with one ask it cannot read, is refused
    /// whole.
    pub fn take_asks(&mut self) -> Result<Vec<(String, Ask)>, tonic::Status> {
        if self.asks.len() > MAX_LEASE_ASKS {
            return Err(tonic::Status::invalid_argument(format!(
                "a lease call carries at most {MAX_LEASE_ASKS} asks, not {}",
                self.asks.len()
            )));
        }
        self.asks.iter_mut().map(LeaseAsk::take_ask).collect()
    }
}

impl LeaseAsk {
    /// The wire form of an ask about `key`.
    pub fn from_ask(key: &str, ask: &Ask) -> Self {
        let hit = Hit {
            key,
            quota: ask.quota,
            hits: ask.want,
        };
        LeaseAsk {
            hit: Some(PeerHit::from_hit(&hit)),
            epoch: ask.epoch,
            used: ask.used,
            keep: ask.keep,
            demand_milli: ask.demand_milli,
            horizon_us: ask.horizon_us,
            safe_capacity: ask.quota.safe_capacity.map_or(0, NonZeroU32::get),
        }
    }

    /// The key and the ask; an unknown unit or algorithm number is refused.
    fn take_ask(&mut self) -> Result<(String, Ask), tonic::Status> {
        let hit = self
            .hit
            .as_mut()
            .ok_or_else(|| tonic::Status::invalid_argument("lease ask without a key"))?;
        let quota = Quota {
            safe_capacity: NonZeroU32::new(self.safe_capacity),
            ..hit.quota()?
        };
        let ask = Ask {
            quota,
            epoch: self.epoch,
            used: self.used,
            keep: self.keep,
            want: hit.hits,
            demand_milli: self.demand_milli,
            horizon_us: self.horizon_us,
        };
        Ok((std::mem::take(&mut hit.key), ask))
    }
}

impl From<&Recall> for FreeRecall {
    fn from(r: &Recall) -> Self {
        let hit = Hit {
            key: &r.key,
            quota: r.quota,
            hits: 0,
        };
        FreeRecall {
            hit: Some(PeerHit::from_hit(&hit)),
            until_us: r.until_us,
        }
    }
}

impl FreeRecall {
    /// The recall, unless it names no key or a quota this node cannot read (then it is
    /// ignored: the owner goes on charging this node's free share of the key).
    pub(crate) fn take_recall(&mut self) -> Option<Recall> {
        let hit = self.hit.as_mut()?;
        let quota = hit.quota().ok()?;
        Some(Recall {
            key: std::mem::take(&mut hit.key).into_boxed_str(),
            quota,
            until_us: self.until_us,
        })
    }
}

impl From<&Grant> for LeaseGrant {
    fn from(g: &Grant) -> Self {
        LeaseGrant {
            leased: g.leased,
            epoch: g.epoch,
            allowance: g.allowance,
            has_next: g.next_allowance.is_some(),
            next_allowance: g.next_allowance.unwrap_or(0),
            valid_us: g.valid_us,
            others: g.others,
            has_fair: g.fair.is_some(),
            fair: g.fair.unwrap_or(0),
            holders: g.holders,
        }
    }
}

impl From<&LeaseGrant> for Grant {
    fn from(g: &LeaseGrant) -> Self {
        Grant {
            leased: g.leased,
            epoch: g.epoch,
            allowance: g.allowance,
            next_allowance: g.has_next.then_some(g.next_allowance),
            fair: g.has_fair.then_some(g.fair),
            valid_us: g.valid_us,
            others: g.others,
            holders: g.holders,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, Unit};
    use prost::Message;

    #[test]
    fn lease_asks_and_grants_cross_the_wire_unchanged() {
        let ask = Ask {
            quota: Quota {
                penalty: None,
                safe_capacity: NonZeroU32::new(30),
                requests_per_unit: 100,
                unit: Unit::Minute,
                algorithm: Algorithm::SlidingWindow,
                burst: None,
                charge_refused: false,
                unit_multiplier: 1,
                calendar: crate::limiter::Calendar::EPOCH,
            },
            epoch: 28_333_333,
            used: 40,
            keep: 55,
            want: 3,
            demand_milli: 12_500,
            horizon_us: 700_000,
        };
        let wire = LeaseAsk::from_ask("d_k_v_", &ask);
        let mut decoded = LeaseAsk::decode(wire.encode_to_vec().as_slice()).unwrap();
        assert_eq!(decoded.take_ask().unwrap(), ("d_k_v_".to_owned(), ask));
        for next in [None, Some(0), Some(17)] {
            let grant = Grant {
                epoch: 28_333_333,
                allowance: 60,
                next_allowance: next,
                fair: next.map(|n| n + 3),
                valid_us: 1_500_000,
                others: 30,
                holders: 4,
                leased: true,
            };
            assert_eq!(Grant::from(&LeaseGrant::from(&grant)), grant);
        }
        // An ask without its key, or with an algorithm this version does not know, is refused.
        let mut keyless = LeaseAsk {
            hit: None,
            ..wire.clone()
        };
        assert_eq!(
            keyless.take_ask().unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        let mut unknown = wire;
        unknown.hit.as_mut().unwrap().algorithm = 9;
        assert!(
            unknown
                .take_ask()
                .unwrap_err()
                .message()
                .contains("algorithm number 9")
        );
    }

    #[test]
    fn a_call_past_the_bound_is_refused_whole() {
        let ask = Ask {
            quota: Quota::fixed(10, Unit::Hour),
            epoch: 0,
            used: 0,
            keep: 0,
            want: 1,
            demand_milli: 0,
            horizon_us: 0,
        };
        let ask = LeaseAsk::from_ask("k", &ask);
        let request = |n| LeaseRequest {
            protocol_version: crate::cluster::peer::PROTOCOL_VERSION,
            node: "a:1".into(),
            asks: vec![ask.clone(); n],
            free_shares: false,
        };
        assert_eq!(
            request(MAX_LEASE_ASKS).take_asks().unwrap().len(),
            MAX_LEASE_ASKS
        );
        let refused = request(MAX_LEASE_ASKS + 1).take_asks().unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            refused.message(),
            "a lease call carries at most 2048 asks, not 2049"
        );
    }
}
