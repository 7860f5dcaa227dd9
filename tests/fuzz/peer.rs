//! The peer protocol: `sluice.peer.v1.Peer/Apply` bodies -> `ApplyRequest` -> the owner's
//! counters, through [`PeerServer`] itself (tonic's codec, the hit checks, the memory store).
//!
//! Generated batches (every unit and algorithm number, valid or not; hits up to `u64::MAX`;
//! refunds; now and then another protocol version) are encoded with prost, mutated and sent as
//! one gRPC call, at a random time on the owner's clock (which may go backwards, as a wall clock
//! can). A batch in another protocol version is refused naming both versions; a batch with a bad
//! hit is refused naming what was bad; a good one gets one decision per hit, each consistent with
//! its quota; a body that does not decode is an INTERNAL error, never a panic.

use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use http_body_util::BodyExt;
use proptest::prelude::*;
use prost::Message;
use sluice::clock::{ManualClock, Timestamp};
use sluice::cluster::ClusterStore;
use sluice::cluster::peer::{
    APPLY_PATH, ApplyRequest, ApplyResponse, PROTOCOL_VERSION, PeerHit, PeerServer,
};
use sluice::limiter::Unit;
use sluice::settings::parse_cli_from;
use sluice::store::MemoryStore;
use tonic::codegen::Service;

use crate::mutate::{apply, mutations, raw_bytes};
use crate::support::{proptest_config, runtime, timed};

/// Protobuf syntax a mutation may insert: the messages' tags, long varints, huge lengths, protocol
/// versions.
const TOKENS: &[&[u8]] = &[
    b"\x0a",
    b"\x0a\x00",
    b"\x10\x01",
    b"\x0a\x02\x18\x63",
    b"\x0a\x02\x20\x09",
    b"\x30\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
    b"\x18\xff\xff\xff\xff\x0f",
    b"\x18\x01",
    b"\x18\x02",
    b"\x0a\xff\xff\xff\xff\x0f",
    b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",
    b"\x0b",
    b"\x0f",
    b"\x00",
];

/// The owner's clock, around 2023, moving by up to a year either way between calls.
const BASE_MICROS: u64 = 1_700_000_000_000_000;
const YEAR_MICROS: u64 = 365 * 86_400 * 1_000_000;

/// An owner with no other peers: what a peer's forwarded hits reach.
struct Owner {
    rt: tokio::runtime::Runtime,
    clock: ManualClock,
    server: PeerServer,
    /// Keeps the cluster's tasks running (they stop when it is dropped).
    _store: ClusterStore,
}

impl Owner {
    fn new() -> Self {
        let rt = runtime();
        let clock = ManualClock::new(Timestamp::from_micros(BASE_MICROS));
        let me = "127.0.0.1:18081";
        let cli = parse_cli_from(["sluice", "--peers", me, "--peer-advertise-address", me])
            .expect("peer flags parse");
        let settings = cli.serve.validate().expect("peer settings are valid");
        let cluster = settings.app.cluster.expect("PEERS makes a cluster");
        let memory = Arc::new(MemoryStore::new(100_000));
        let store = rt.block_on(async {
            ClusterStore::start(memory, &cluster, None, Arc::new(clock.clone())).expect("starts")
        });
        let server = PeerServer::new(store.owner().clone(), Arc::new(clock.clone()), None, None);
        Owner {
            rt,
            clock,
            server,
            _store: store,
        }
    }

    /// One unary call carrying `message` (already encoded): the gRPC status, and the decoded
    /// response when the status is OK.
    fn call(&mut self, message: &[u8]) -> (tonic::Status, Option<ApplyResponse>) {
        let mut framed = vec![0u8];
        framed.extend_from_slice(
            &u32::try_from(message.len())
                .unwrap_or(u32::MAX)
                .to_be_bytes(),
        );
        framed.extend_from_slice(message);
        let request = axum::http::Request::post(APPLY_PATH)
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(Body::from(framed))
            .expect("a request");
        let server = &mut self.server;
        self.rt.block_on(async move {
            let response = server.call(request).await.expect("infallible");
            let (parts, body) = response.into_parts();
            let collected = body.collect().await.expect("an in-memory body");
            let trailers = collected.trailers().cloned().unwrap_or_default();
            let data: Bytes = collected.to_bytes();
            let status = tonic::Status::from_header_map(&parts.headers)
                .or_else(|| tonic::Status::from_header_map(&trailers))
                .expect("a grpc-status");
            let reply = (status.code() == tonic::Code::Ok).then(|| {
                assert!(data.len() >= 5, "an OK answer without a message");
                ApplyResponse::decode(&data[5..]).expect("the answer decodes")
            });
            (status, reply)
        })
    }
}

thread_local! {
    static OWNER: std::cell::RefCell<Owner> = std::cell::RefCell::new(Owner::new());
}

/// How the owner must refuse a batch, if it must: another protocol version first, then the
/// first hit with a unit (Envoy's numbers, 1 to 7), a calendar or an algorithm (0 to 3) it
/// does not know.
fn first_problem(req: &ApplyRequest) -> Option<(tonic::Code, String)> {
    if req.protocol_version != PROTOCOL_VERSION {
        return Some((
            tonic::Code::FailedPrecondition,
            format!(
                "peer protocol version {} is not supported by this node (speaks 1)",
                req.protocol_version
            ),
        ));
    }
    req.hits.iter().find_map(|h| {
        let refused = |what: &str, n: i32| {
            Some((
                tonic::Code::InvalidArgument,
                format!("peer hit: unknown {what} number {n}"),
            ))
        };
        let window = Unit::from_proto_number(h.unit)
            .map(|u| sluice::limiter::Window::new(u, h.unit_multiplier).secs());
        if !(1..=7).contains(&h.unit) {
            refused("unit", h.unit)
        } else if window.is_some_and(|w| w > sluice::limiter::Window::MAX_SECS) {
            Some((
                tonic::Code::InvalidArgument,
                format!(
                    "peer hit: unit_multiplier {} makes too long a window",
                    h.unit_multiplier
                ),
            ))
        } else if let Err(e) = sluice::limiter::Calendar::from_wire(&h.calendar) {
            Some((tonic::Code::InvalidArgument, format!("peer hit: {e}")))
        } else if h.penalty_secs > 366 * 86_400 {
            Some((
                tonic::Code::InvalidArgument,
                format!(
                    "peer hit: penalty_secs {} is longer than a year",
                    h.penalty_secs
                ),
            ))
        } else if !(0..=3).contains(&h.algorithm) {
            refused("algorithm", h.algorithm)
        } else {
            None
        }
    })
}

/// One decision is consistent with its hit's quota.
fn check_decision(hit: &PeerHit, d: &sluice::cluster::peer::PeerDecision) {
    assert!(!d.over || d.remaining == 0, "over with room left: {d:?}");
    if d.penalized {
        // Refused by a penalty: only a hit of a limit with one, its counter untouched.
        assert!(hit.penalty_secs > 0, "{hit:?} {d:?}");
        assert_eq!((d.over, d.remaining), (hit.hits > 0, 0), "{d:?}");
        assert!(
            d.reset_after_secs <= u64::from(hit.penalty_secs),
            "{hit:?} {d:?}"
        );
        return;
    }
    let unit = Unit::from_proto_number(hit.unit).expect("checked");
    if hit.algorithm == 0 {
        // A fixed window: the count grows by the hits (saturating), and the answer follows.
        let limit = u64::from(hit.requests_per_unit);
        assert!(d.count_after >= d.count_before, "{d:?}");
        assert!(d.count_after - d.count_before <= hit.hits, "{d:?}");
        assert_eq!(d.over, d.count_after > limit, "{hit:?} {d:?}");
        if !d.over {
            assert_eq!(u64::from(d.remaining), limit - d.count_after);
        }
        let calendar = sluice::limiter::Calendar::from_wire(&hit.calendar).expect("checked");
        let window = sluice::limiter::Window::new(unit, hit.unit_multiplier).on(calendar);
        // A refusal that starts a penalty says the longer of the window's reset and the penalty.
        let penalty = if d.over {
            u64::from(hit.penalty_secs)
        } else {
            0
        };
        assert!(
            (1..=window.max_secs().max(penalty)).contains(&d.reset_after_secs),
            "{d:?}"
        );
    }
}

/// The check for one Apply message body, at `now_offset` microseconds past the base time
/// (wrapping within two years, so the clock moves both ways).
pub fn check_apply(message: &[u8], now_offset: u64) {
    let decoded = ApplyRequest::decode(message);
    let (status, reply) = OWNER.with(|owner| {
        let mut owner = owner.borrow_mut();
        let now = BASE_MICROS - YEAR_MICROS + now_offset % (2 * YEAR_MICROS);
        owner.clock.set(Timestamp::from_micros(now));
        owner.call(message)
    });
    let req = match decoded {
        Ok(req) => req,
        Err(_) => {
            assert_eq!(status.code(), tonic::Code::Internal, "{status:?}");
            assert!(!status.message().is_empty());
            return;
        }
    };
    if let Some((code, problem)) = first_problem(&req) {
        assert_eq!(status.code(), code, "{status:?}");
        assert_eq!(status.message(), problem);
        return;
    }
    match status.code() {
        tonic::Code::Ok => {
            let decisions = reply.expect("a reply").decisions;
            // A reset answers nothing; a refund, a peek at each counter after it (a reset flag
            // wins over a refund flag beside it).
            if req.reset {
                assert!(decisions.is_empty());
                return;
            }
            assert_eq!(decisions.len(), req.hits.len());
            for (hit, d) in req.hits.iter().zip(&decisions) {
                check_decision(hit, d);
            }
        }
        // A full store is the one refusal a well-formed batch may get.
        tonic::Code::Unavailable => {
            assert!(
                status.message().contains("SLUICE_MAX_COUNTERS"),
                "{status:?}"
            )
        }
        other => panic!("{other:?} for a well-formed batch: {status:?}"),
    }
}

/// One cargo-fuzz input (`fuzz/fuzz_targets/peer.rs`): the owner's clock (the first 8 bytes,
/// little-endian, zero-padded when fewer), then an Apply message body.
pub fn check_fuzz_input(data: &[u8]) {
    let (now, message) = data.split_at(data.len().min(8));
    let mut word = [0u8; 8];
    word[..now.len()].copy_from_slice(now);
    check_apply(message, u64::from_le_bytes(word));
}

fn hit() -> impl Strategy<Value = PeerHit> {
    (
        prop_oneof![Just("d_k_v_".to_owned()), "[a-z_]{1,6}", "\\PC{0,4}",],
        prop_oneof![0u32..10, any::<u32>(), Just(u32::MAX)],
        prop_oneof![8 => 1i32..8, 1 => any::<i32>()],
        prop_oneof![8 => 0i32..4, 1 => any::<i32>()],
        prop_oneof![Just(0u32), 1u32..10, any::<u32>(), Just(u32::MAX)],
        prop_oneof![0u64..4, any::<u64>(), Just(u64::MAX)],
        any::<bool>(),
        prop_oneof![8 => Just(0u32), 1 => 1u32..10, 1 => any::<u32>()],
        (
            prop_oneof![8 => Just(0u32), 1 => 1u32..5, 1 => any::<u32>()],
            any::<bool>(),
        ),
        prop_oneof![
            6 => Just(String::new()),
            1 => Just("go-month".to_owned()),
            1 => Just("Asia/Tokyo".to_owned()),
            1 => Just("America/New_York sunday".to_owned()),
            1 => "\\PC{0,12}",
        ],
    )
        .prop_map(
            |(
                key,
                requests_per_unit,
                unit,
                algorithm,
                burst,
                hits,
                charge_refused,
                unit_multiplier,
                (penalty_secs, penalty_extends),
                calendar,
            )| {
                PeerHit {
                    key,
                    requests_per_unit,
                    unit,
                    algorithm,
                    burst,
                    hits,
                    charge_refused,
                    unit_multiplier,
                    relay: 0,
                    calendar,
                    penalty_secs,
                    penalty_extends,
                }
            },
        )
}

fn batch() -> impl Strategy<Value = ApplyRequest> {
    (
        proptest::collection::vec(hit(), 0..8),
        any::<bool>(),
        prop_oneof![8 => Just(PROTOCOL_VERSION), 1 => 0u32..4, 1 => any::<u32>()],
        prop_oneof![8 => Just(false), 1 => Just(true)],
    )
        .prop_map(|(hits, refund, protocol_version, reset)| ApplyRequest {
            hits,
            refund,
            protocol_version,
            reset,
        })
}

proptest! {
    #![proptest_config(proptest_config(512, "proptest-regressions/fuzz/peer.txt"))]

    #[test]
    fn generated_batches_are_applied_or_refused(req in batch(), now in any::<u64>()) {
        let bytes = req.encode_to_vec();
        timed("peer generated", || check_apply(&bytes, now));
    }

    #[test]
    fn mutated_batches_are_applied_or_refused(
        req in batch(),
        edits in mutations(6),
        now in any::<u64>(),
    ) {
        let mut bytes = req.encode_to_vec();
        apply(&mut bytes, &edits, TOKENS);
        timed("peer mutated", || check_apply(&bytes, now));
    }

    #[test]
    fn raw_bodies_are_applied_or_refused(bytes in raw_bytes(512), now in any::<u64>()) {
        let input = [now.to_le_bytes().as_slice(), &bytes].concat();
        timed("peer raw", || check_fuzz_input(&input));
    }
}
