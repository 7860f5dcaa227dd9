//! The Apply call's messages as Sluice's types: a [`Hit`] as a [`PeerHit`] (also the form of a
//! Lease ask's key and quota), a [`Decision`] as a [`PeerDecision`], and what a request asks,
//! [`Op`], which [`Op::run`] does on a store. An owner refuses a hit whose numbers it does not
//! know, never reads it as another.

use std::num::NonZeroU32;

use super::{
    ApplyRequest, PROTOCOL_VERSION, PeerDecision, PeerHit, algorithm_from_wire, algorithm_to_wire,
    unit_from_wire, unit_to_wire, wire,
};
use crate::clock::Timestamp;
use crate::cluster::join::Relay;
use crate::limiter::{Calendar, Decision, Penalty, Quota};
use crate::store::{CounterStore, Hit, StoreError};

impl ApplyRequest {
    /// A request in this node's protocol version.
    pub fn new(hits: Vec<PeerHit>, op: Op) -> Self {
        ApplyRequest {
            hits,
            refund: op == Op::Refund,
            reset: op == Op::Reset,
            protocol_version: PROTOCOL_VERSION,
        }
    }

    /// What the request asks; a reset wins over a refund flag set beside it.
    pub fn op(&self) -> Op {
        if self.reset {
            Op::Reset
        } else if self.refund {
            Op::Refund
        } else {
            Op::Apply
        }
    }
}

/// What a call does to its hits' counters: charge them, take them off (a refund), both
/// answering one decision per hit; or forget them (the counter admin's reset), answering
/// nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Apply,
    Refund,
    Reset,
}

impl Op {
    /// Whether the call answers one decision per hit (a refund: a peek at what it left; an
    /// owner older than that answers none, see [`Op::may_answer_nothing`]).
    pub fn answers(self) -> bool {
        self != Op::Reset
    }

    /// Whether an answer with no decisions is still a success: a refund sent to an owner that
    /// predates refunds' answers (it gave the hits back and said nothing).
    pub(crate) fn may_answer_nothing(self) -> bool {
        self != Op::Apply
    }

    /// Does this to `hits` on `store` at `now`: a charge or a refund pushes one decision per
    /// hit onto `out`, a reset none.
    pub(crate) async fn run<S: CounterStore>(
        self,
        store: &S,
        now: Timestamp,
        hits: &[Hit<'_>],
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        match self {
            Op::Apply => store.apply(now, hits, out).await,
            Op::Refund => store.refund(now, hits, out).await,
            Op::Reset => store.reset(now, hits).await,
        }
    }
}

impl PeerHit {
    pub fn from_hit(h: &Hit<'_>) -> Self {
        let q = h.quota;
        PeerHit {
            key: h.key.to_owned(),
            requests_per_unit: q.requests_per_unit,
            unit: unit_to_wire(q.unit) as i32,
            algorithm: algorithm_to_wire(q.algorithm) as i32,
            burst: q.burst.map_or(0, NonZeroU32::get),
            hits: h.hits,
            charge_refused: q.charge_refused,
            // 0 for one unit, so a plain limit's bytes stay what older owners expect.
            unit_multiplier: if q.unit_multiplier > 1 {
                q.unit_multiplier
            } else {
                0
            },
            relay: wire::Relay::None as i32,
            calendar: q.calendar.wire(),
            penalty_secs: q.penalty.map_or(0, |p| p.secs.get()),
            penalty_extends: q.penalty.is_some_and(|p| p.extends),
        }
    }

    /// The hit as a joining node relays it to the key's previous owner, which applies it to
    /// its own counter (`how`) and never relays it again ([`crate::cluster::join`]).
    pub fn relayed(h: &Hit<'_>, how: Relay) -> Self {
        let relay = match how {
            Relay::No => wire::Relay::None,
            Relay::Apply => wire::Relay::Apply,
            Relay::Take => wire::Relay::Take,
        };
        PeerHit {
            relay: relay as i32,
            ..PeerHit::from_hit(h)
        }
    }

    /// How the hit reached this node; an unknown number is refused, never read as another.
    pub(crate) fn how_relayed(&self) -> Result<Relay, tonic::Status> {
        Ok(match wire::Relay::try_from(self.relay) {
            Ok(wire::Relay::None) => Relay::No,
            Ok(wire::Relay::Apply) => Relay::Apply,
            Ok(wire::Relay::Take) => Relay::Take,
            Err(_) => {
                return Err(tonic::Status::invalid_argument(format!(
                    "peer hit: unknown relay number {}",
                    self.relay
                )));
            }
        })
    }

    /// The quota this hit's counter enforces; an unknown unit or algorithm number is refused,
    /// never read as another.
    pub fn quota(&self) -> Result<Quota, tonic::Status> {
        let unknown = |what: &str, n: i32| {
            tonic::Status::invalid_argument(format!("peer hit: unknown {what} number {n}"))
        };
        let unit = unit_from_wire(self.unit).ok_or_else(|| unknown("unit", self.unit))?;
        if crate::limiter::Window::new(unit, self.unit_multiplier).secs()
            > crate::limiter::Window::MAX_SECS
        {
            return Err(tonic::Status::invalid_argument(format!(
                "peer hit: unit_multiplier {} makes too long a window",
                self.unit_multiplier
            )));
        }
        let calendar = Calendar::from_wire(&self.calendar)
            .map_err(|e| tonic::Status::invalid_argument(format!("peer hit: {e}")))?;
        if self.penalty_secs > crate::config::build::MAX_PENALTY_SECS {
            return Err(tonic::Status::invalid_argument(format!(
                "peer hit: penalty_secs {} is longer than a year",
                self.penalty_secs
            )));
        }
        Ok(Quota {
            penalty: NonZeroU32::new(self.penalty_secs).map(|secs| Penalty {
                secs,
                extends: self.penalty_extends,
            }),
            requests_per_unit: self.requests_per_unit,
            unit,
            unit_multiplier: self.unit_multiplier.max(1),
            calendar,
            algorithm: algorithm_from_wire(self.algorithm)
                .ok_or_else(|| unknown("algorithm", self.algorithm))?,
            burst: NonZeroU32::new(self.burst),
            charge_refused: self.charge_refused,
            // Never on the wire: only a node cut off from its peers uses it, on its own hits.
            safe_capacity: None,
        })
    }
}

impl From<&Decision> for PeerDecision {
    fn from(d: &Decision) -> Self {
        PeerDecision {
            over: d.over,
            remaining: d.remaining,
            reset_after_secs: d.reset_after_secs,
            count_before: d.count_before,
            count_after: d.count_after,
            expired: d.expired,
            taken: None,
            penalized: d.penalized,
        }
    }
}

impl PeerDecision {
    /// The answer to a [`Relay::Take`] hit: this node's state of the counter, as `window` and
    /// `values` ([`crate::limiter::CounterKind::parts`]; none: it holds nothing), and when the
    /// key's penalty ends (0: none).
    pub fn taken(window: u64, values: Vec<u64>, penalty_until_us: u64) -> Self {
        PeerDecision {
            taken: Some(wire::CounterState {
                window,
                values,
                penalty_until_us,
            }),
            ..PeerDecision::default()
        }
    }
}

impl From<PeerDecision> for Decision {
    fn from(d: PeerDecision) -> Self {
        Decision {
            penalized: d.penalized,
            over: d.over,
            remaining: d.remaining,
            reset_after_secs: d.reset_after_secs,
            count_before: d.count_before,
            count_after: d.count_after,
            expired: d.expired,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{ApplyResponse, version_mismatch};
    use super::*;
    use crate::limiter::{Algorithm, Unit};
    use prost::Message;

    fn hit(key: &str, rate: u32, unit: Unit, algorithm: Algorithm, burst: u32, n: u64) -> PeerHit {
        let quota = Quota {
            penalty: None,
            safe_capacity: None,
            requests_per_unit: rate,
            unit,
            algorithm,
            burst: NonZeroU32::new(burst),
            charge_refused: false,
            unit_multiplier: 1,
            calendar: crate::limiter::Calendar::EPOCH,
        };
        PeerHit::from_hit(&Hit {
            key,
            quota,
            hits: n,
        })
    }

    /// One hit of each algorithm, on several units.
    fn known_batch() -> ApplyRequest {
        ApplyRequest::new(
            vec![
                hit("d_k_v_", 10, Unit::Hour, Algorithm::FixedWindow, 0, 1),
                hit("d_k_w_", 5, Unit::Day, Algorithm::SlidingWindow, 0, 2),
                hit("d_k_x_", 100, Unit::Minute, Algorithm::TokenBucket, 20, 3),
                hit("d_k_y_", 7, Unit::Week, Algorithm::LeakyBucket, 2, 300),
            ],
            Op::Apply,
        )
    }

    /// The bytes of [`known_batch`]. Without the final `1801` (protocol_version 1) they are
    /// exactly what the unversioned protocol before the .proto sent, which is why a node of
    /// that build reads version 1 hits right.
    const KNOWN_BATCH_HEX: &str = concat!(
        "0a0e0a06645f6b5f765f100a18033001",
        "0a100a06645f6b5f775f100518042001",
        "30020a120a06645f6b5f785f10641802",
        "2002281430030a130a06645f6b5f795f",
        "100718072003280230ac02",
        "1801",
    );

    /// Two decisions, one over the limit.
    fn known_answer() -> ApplyResponse {
        ApplyResponse {
            decisions: vec![
                PeerDecision {
                    over: false,
                    remaining: 9,
                    reset_after_secs: 3_599,
                    count_before: 0,
                    count_after: 1,
                    expired: 0,
                    taken: None,
                    penalized: false,
                },
                PeerDecision {
                    over: true,
                    remaining: 0,
                    reset_after_secs: 60,
                    count_before: 5,
                    count_after: 7,
                    expired: 0,
                    taken: None,
                    penalized: false,
                },
            ],
        }
    }

    const KNOWN_ANSWER_HEX: &str = "0a071009188f1c28010a080801183c20052807";

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    #[test]
    fn pinned_wire_bytes() {
        // An accidental change to the .proto, the mapping or the encoder fails here first.
        assert_eq!(hex(&known_batch().encode_to_vec()), KNOWN_BATCH_HEX);
        assert_eq!(hex(&known_answer().encode_to_vec()), KNOWN_ANSWER_HEX);
        let batch = ApplyRequest::decode(unhex(KNOWN_BATCH_HEX).as_slice()).expect("decodes");
        assert_eq!(batch, known_batch());
        assert_eq!(batch.protocol_version, 1);
        let quotas: Vec<Quota> = batch.hits.iter().map(|h| h.quota().unwrap()).collect();
        assert_eq!(
            quotas.iter().map(|q| q.algorithm).collect::<Vec<_>>(),
            Algorithm::ALL[..4]
        );
        assert_eq!(
            quotas[2],
            Quota {
                penalty: None,
                safe_capacity: None,
                requests_per_unit: 100,
                unit: Unit::Minute,
                algorithm: Algorithm::TokenBucket,
                burst: NonZeroU32::new(20),
                charge_refused: false,
                unit_multiplier: 1,
                calendar: crate::limiter::Calendar::EPOCH,
            }
        );
        let answer = ApplyResponse::decode(unhex(KNOWN_ANSWER_HEX).as_slice()).expect("decodes");
        assert_eq!(answer, known_answer());
    }

    #[test]
    fn unknown_algorithm_and_unit_numbers_are_refused_naming_the_number() {
        let refused = |unit: i32, algorithm: i32| {
            let mut h = hit("k", 1, Unit::Second, Algorithm::FixedWindow, 0, 1);
            h.unit = unit;
            h.algorithm = algorithm;
            let status = h.quota().expect_err("refused");
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            status.message().to_owned()
        };
        assert_eq!(refused(1, 5), "peer hit: unknown algorithm number 5");
        assert_eq!(refused(1, -1), "peer hit: unknown algorithm number -1");
        assert_eq!(refused(0, 0), "peer hit: unknown unit number 0");
        assert_eq!(refused(8, 0), "peer hit: unknown unit number 8");
        assert_eq!(
            refused(i32::MIN, 9),
            "peer hit: unknown unit number -2147483648"
        );
    }

    /// A calendar crosses the wire by name (field 10): the owner counts in the same windows; an
    /// epoch window's hit carries no field 10, so its bytes are what older owners read; a zone
    /// the owner does not know is refused by name.
    #[test]
    fn calendars_cross_the_wire_by_name_and_unknown_zones_are_refused() {
        let tokyo = crate::limiter::Calendar::zone("Asia/Tokyo", None).unwrap();
        let epoch = hit("k", 1, Unit::Day, Algorithm::FixedWindow, 0, 1);
        let mut zoned = epoch.clone();
        let quota = Quota {
            calendar: tokyo,
            ..epoch.quota().unwrap()
        };
        zoned.calendar = quota.calendar.wire();
        assert_eq!(zoned.quota().unwrap(), quota);
        let bytes = |h: &PeerHit| h.encode_to_vec();
        assert_eq!(bytes(&zoned)[..bytes(&epoch).len()], bytes(&epoch)[..]);
        assert!(bytes(&zoned).ends_with(b"\x52\x0aAsia/Tokyo"));
        zoned.calendar = "Nowhere/Bogus".to_owned();
        let status = zoned.quota().expect_err("refused");
        assert!(
            status
                .message()
                .contains("unknown time_zone 'Nowhere/Bogus'"),
            "{status:?}"
        );
    }

    /// A relayed hit is the plain hit's bytes plus field 9 (`4801` applied, `4802` taken over),
    /// and a counter handed over is field 7 of the decision: an owner that predates relays
    /// reads the hit as the one it always knew and applies it.
    #[test]
    fn relays_add_fields_and_change_no_other_byte() {
        let plain = Hit {
            key: "d_k_v_",
            quota: Quota::fixed(10, Unit::Hour),
            hits: 1,
        };
        let bytes = |h: PeerHit| hex(&h.encode_to_vec());
        let base = bytes(PeerHit::from_hit(&plain));
        assert_eq!(bytes(PeerHit::relayed(&plain, Relay::No)), base);
        assert_eq!(
            bytes(PeerHit::relayed(&plain, Relay::Apply)),
            format!("{base}4801")
        );
        assert_eq!(
            bytes(PeerHit::relayed(&plain, Relay::Take)),
            format!("{base}4802")
        );
        for how in [Relay::No, Relay::Apply, Relay::Take] {
            assert_eq!(PeerHit::relayed(&plain, how).how_relayed().unwrap(), how);
        }
        let mut unknown = PeerHit::from_hit(&plain);
        unknown.relay = 3;
        let status = unknown.how_relayed().expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(status.message(), "peer hit: unknown relay number 3");
        // Window 7, counts 5 and 2: field 7 holding field 1 = 7, field 2 = [5, 2] packed.
        assert_eq!(
            hex(&PeerDecision::taken(7, vec![5, 2], 0).encode_to_vec()),
            "3a06080712020502"
        );
    }

    #[test]
    fn only_this_nodes_protocol_version_is_accepted() {
        assert!(version_mismatch(PROTOCOL_VERSION).is_none());
        assert_eq!(known_batch().protocol_version, PROTOCOL_VERSION);
        for (other, message) in [
            (
                0,
                "peer protocol version 0 is not supported by this node (speaks 1)",
            ),
            (
                2,
                "peer protocol version 2 is not supported by this node (speaks 1)",
            ),
        ] {
            let status = version_mismatch(other).expect("refused");
            assert_eq!(status.code(), tonic::Code::FailedPrecondition);
            assert_eq!(status.message(), message);
        }
    }

    #[test]
    fn refunds_answer_decisions_and_resets_do_not() {
        assert!(Op::Apply.answers() && Op::Refund.answers() && !Op::Reset.answers());
        assert!(!Op::Apply.may_answer_nothing() && Op::Refund.may_answer_nothing());
    }
}
