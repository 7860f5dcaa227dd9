//! Lease mode at N held keys per node (issue 40's scale envelope): what one renewal round of
//! all of them costs.
//!
//! A node's [`LeaseClient`] acquires N keys (27 to 35 bytes, like the service's counter key
//! stems) from an owner's [`LeaseServer`], uses each once, and a renewal interval later
//! (SLUICE_LEASE_RENEW_MS, 100 ms by default) renews them all, as the node's renewal task does:
//! [`LeaseClient::renewals`], the asks encoded into Lease calls of at most
//! [`MAX_LEASE_ASKS`] each, decoded and answered by the owner, the grants encoded, decoded and
//! applied. Prints the time of each step (one thread, so CPU time), the bytes of the calls and
//! answers, the share of one core renewing every 100 ms takes on each side, and resident bytes
//! per key of both tables; one JSON line on stdout. Exits 1 when a key is not renewed or an
//! answer does not match its ask.
//!
//! ```sh
//! cargo run --release -p sluice-bench --bin scale_lease -- 100000
//! ```

#![allow(
    clippy::disallowed_methods,
    reason = "a benchmark's own stopwatch, outside Sluice"
)]

use std::time::Instant;

use prost::Message;
use sluice::clock::Timestamp;
use sluice::cluster::lease::{
    Due, Grant, LeaseClient, LeaseServer, LeaseTiming, MAX_LEASE_ASKS, Route,
};
use sluice::cluster::peer::{LeaseAsk, LeaseGrant, LeaseRequest, LeaseResponse};
use sluice::limiter::{Quota, Unit};
use sluice_test_support::bench::rss::rss_bytes;

const T0: u64 = 1_700_000_000_000_000;
const NODE: &str = "10.244.1.17:8082";

fn key(i: u64) -> String {
    format!(
        "edge_remote_address_{}.{}.{}.{}_",
        (i >> 24) & 0xff,
        (i >> 16) & 0xff,
        (i >> 8) & 0xff,
        i & 0xff
    )
}

/// Milliseconds since `t`.
fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// The node holds `n` keys, leased by `server`, each used once after its acquire.
fn hold(client: &LeaseClient, server: &LeaseServer, n: u64, quota: Quota) {
    let now = Timestamp::from_micros(T0);
    for i in 0..n {
        let k = key(i);
        let Route::Acquire(slot, ask) = client.route(&k, quota, T0, 1, || 3, || None) else {
            panic!("a new key acquires");
        };
        let grant = server.answer(NODE, &k, &ask, now, Timestamp::from_micros(0), 3);
        slot.answer(Some(&grant), T0);
        assert!(
            matches!(
                client.route(&k, quota, T0 + 10_000, 1, || 3, || None),
                Route::Decided(_)
            ),
            "a held key is decided locally"
        );
    }
}

/// Step times (ms) and bytes of one renewal round of `due`.
struct Round {
    encode_ms: f64,
    answer_ms: f64,
    apply_ms: f64,
    ask_bytes: usize,
    grant_bytes: usize,
}

/// The round: asks encoded in calls, the owner's answers, the grants applied.
fn round(server: &LeaseServer, due: &[Due], now_us: u64) -> Round {
    let t = Instant::now();
    let calls: Vec<Vec<u8>> = due
        .chunks(MAX_LEASE_ASKS)
        .map(|chunk| {
            LeaseRequest {
                protocol_version: 1,
                node: NODE.to_owned(),
                asks: chunk
                    .iter()
                    .map(|(k, _, ask)| LeaseAsk::from_ask(k, ask))
                    .collect(),
                free_shares: false,
            }
            .encode_to_vec()
        })
        .collect();
    let encode_ms = ms(t);
    let ask_bytes = calls.iter().map(Vec::len).sum();
    let t = Instant::now();
    let now = Timestamp::from_micros(now_us);
    let answers: Vec<Vec<u8>> = calls
        .iter()
        .map(|call| {
            let mut request = LeaseRequest::decode(call.as_slice()).expect("a call decodes");
            let asks = request.take_asks().expect("asks the owner takes");
            let grants = asks
                .iter()
                .map(|(k, ask)| {
                    let g = server.answer(&request.node, k, ask, now, Timestamp::from_micros(0), 3);
                    LeaseGrant::from(&g)
                })
                .collect();
            LeaseResponse {
                grants,
                permit: None,
                recalls: Vec::new(),
            }
            .encode_to_vec()
        })
        .collect();
    let answer_ms = ms(t);
    let grant_bytes = answers.iter().map(Vec::len).sum();
    let t = Instant::now();
    for (answer, chunk) in answers.iter().zip(due.chunks(MAX_LEASE_ASKS)) {
        let response = LeaseResponse::decode(answer.as_slice()).expect("an answer decodes");
        assert_eq!(response.grants.len(), chunk.len(), "one grant per ask");
        for (g, (_, slot, _)) in response.grants.iter().zip(chunk) {
            let grant = Grant::from(g);
            assert!(grant.leased, "a renewal is granted");
            slot.answer(Some(&grant), now_us);
        }
    }
    Round {
        encode_ms,
        answer_ms,
        apply_ms: ms(t),
        ask_bytes,
        grant_bytes,
    }
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .map_or(100_000, |s| s.parse().expect("N is a count"));
    let timing = LeaseTiming {
        max_bytes: usize::MAX,
        ..LeaseTiming::DEFAULT
    };
    let renew_us = u64::try_from(timing.renew.as_micros()).expect("a renewal interval");
    let quota = Quota::fixed(1_000_000, Unit::Minute);
    let before = rss_bytes();
    let client = LeaseClient::new(timing);
    let server = LeaseServer::new(timing);
    let t = Instant::now();
    hold(&client, &server, n, quota);
    let fill_s = t.elapsed().as_secs_f64();
    let rss = rss_bytes().saturating_sub(before);
    let now_us = T0 + renew_us;
    let t = Instant::now();
    let due = client.renewals(now_us, 0, 3);
    let renewals_ms = ms(t);
    assert_eq!(due.len() as u64, n, "every held key is renewed");
    let r = round(&server, &due, now_us);
    let node_ms = renewals_ms + r.encode_ms + r.apply_ms;
    let per_second = 1e6 / renew_us as f64;
    let share = |ms: f64| ms / 1e3 * per_second;
    eprintln!(
        "scale_lease: {n} keys held ({fill_s:.1} s to acquire), {:.0} resident bytes per key \
         (node and owner); a renewal round: node {renewals_ms:.1} ms to collect, {:.1} ms to \
         encode, {:.1} ms to apply ({:.3} of a core every {} ms); owner {:.1} ms ({:.3} of a \
         core); {:.1} bytes per key asked, {:.1} answered",
        rss as f64 / n as f64,
        r.encode_ms,
        r.apply_ms,
        share(node_ms),
        renew_us / 1000,
        r.answer_ms,
        share(r.answer_ms),
        r.ask_bytes as f64 / n as f64,
        r.grant_bytes as f64 / n as f64,
    );
    println!(
        "{{\"curve\":\"lease\",\"n\":{n},\"rss_bytes\":{rss},\"bytes_per_key\":{:.1},\
         \"renew_ms\":{},\"node_ms\":{node_ms:.2},\"owner_ms\":{:.2},\
         \"node_core_share\":{:.4},\"owner_core_share\":{:.4},\"ask_bytes\":{},\
         \"grant_bytes\":{},\"wire_bytes_per_key\":{:.1},\"wire_mb_per_s\":{:.2}}}",
        rss as f64 / n as f64,
        renew_us / 1000,
        r.answer_ms,
        share(node_ms),
        share(r.answer_ms),
        r.ask_bytes,
        r.grant_bytes,
        (r.ask_bytes + r.grant_bytes) as f64 / n as f64,
        (r.ask_bytes + r.grant_bytes) as f64 * per_second / 1e6,
    );
}
