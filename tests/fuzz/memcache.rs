//! What the memcache backend reads from the network: memcached's replies
//! (`store::memcache::protocol`) and DNS answers to the SRV lookup (`store::memcache::srv`).
//!
//! Replies are modelled (a batch of commands and one valid reply each), written as memcached
//! writes them, and must read back as the model; mutated or raw, they must be refused or read as
//! one reply per command, never panic, and never hold a value past the protocol's cap. DNS
//! answers are built from SRV records (names compressed against the question, as servers do) and
//! must decode to those records; mutated or raw, decoding never panics.

use proptest::prelude::*;
use sluice::store::memcache::protocol::{Batch, Item, MAX_VALUE_BYTES, Reply};
use sluice::store::memcache::srv::decode_srv;

use crate::mutate::{apply, mutations, raw_bytes};
use crate::support::{proptest_config, runtime, timed};

/// Tokens of memcached's replies a mutation may insert.
const REPLY_TOKENS: &[&[u8]] = &[
    b"\r\n",
    b"END\r\n",
    b"VALUE k 0 2\r\n",
    b"VALUE k 0 99999999999 1\r\n",
    b" ",
    b"NOT_FOUND\r\n",
    b"STORED\r\n",
    b"SERVER_ERROR x\r\n",
    b"18446744073709551616",
];

/// One command and the reply memcached gives it.
#[derive(Clone, Debug)]
enum Exchange {
    Get(Vec<(String, Vec<u8>)>),
    Gets(Option<(Vec<u8>, u64)>),
    Incr(Option<u64>),
    Add(bool),
    Cas(u8),
    Delete(bool),
}

fn key() -> impl Strategy<Value = String> {
    "[a-z0-9_:]{1,20}"
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..=MAX_VALUE_BYTES)
}

fn exchange() -> impl Strategy<Value = Exchange> {
    prop_oneof![
        proptest::collection::vec((key(), value()), 0..4).prop_map(Exchange::Get),
        proptest::option::of((value(), any::<u64>())).prop_map(Exchange::Gets),
        proptest::option::of(any::<u64>()).prop_map(Exchange::Incr),
        any::<bool>().prop_map(Exchange::Add),
        (0u8..3).prop_map(Exchange::Cas),
        any::<bool>().prop_map(Exchange::Delete),
    ]
}

/// The batch, the bytes memcached answers it with, and the replies they must read as.
fn exchanges(model: &[Exchange]) -> (Batch, Vec<u8>, Vec<Reply>) {
    let mut batch = Batch::default();
    let mut wire = Vec::new();
    let mut replies = Vec::new();
    for e in model {
        let (last_line, reply) = match e {
            Exchange::Get(items) => {
                let keys: Vec<&str> = items.iter().map(|(k, _)| k.as_str()).collect();
                batch.get(if keys.is_empty() { &["k"] } else { &keys });
                let items = items.iter().map(|(k, v)| (k.clone(), v.clone(), None));
                ("END".to_owned(), values(&mut wire, items.collect()))
            }
            Exchange::Gets(found) => {
                batch.gets("k");
                let items = found
                    .iter()
                    .map(|(v, cas)| ("k".to_owned(), v.clone(), Some(*cas)));
                ("END".to_owned(), values(&mut wire, items.collect()))
            }
            Exchange::Incr(n) => {
                batch.incr("k", 1);
                match n {
                    Some(n) => (n.to_string(), Reply::Number(*n)),
                    None => ("NOT_FOUND".to_owned(), Reply::NotFound),
                }
            }
            Exchange::Add(stored) => {
                batch.add("k", "1", 60);
                match stored {
                    true => ("STORED".to_owned(), Reply::Stored),
                    false => ("NOT_STORED".to_owned(), Reply::NotStored),
                }
            }
            Exchange::Cas(outcome) => {
                batch.cas("k", "2", 60, 7);
                match outcome {
                    0 => ("STORED".to_owned(), Reply::Stored),
                    1 => ("EXISTS".to_owned(), Reply::Exists),
                    _ => ("NOT_FOUND".to_owned(), Reply::NotFound),
                }
            }
            Exchange::Delete(deleted) => {
                batch.delete("k");
                match deleted {
                    true => ("DELETED".to_owned(), Reply::Deleted),
                    false => ("NOT_FOUND".to_owned(), Reply::NotFound),
                }
            }
        };
        wire.extend_from_slice(last_line.as_bytes());
        wire.extend_from_slice(b"\r\n");
        replies.push(reply);
    }
    (batch, wire, replies)
}

/// Writes `VALUE` blocks for `items` (key, value, cas unique); the reply they read as.
fn values(wire: &mut Vec<u8>, items: Vec<(String, Vec<u8>, Option<u64>)>) -> Reply {
    let mut read = Vec::new();
    for (key, value, cas) in items {
        let unique = cas.map(|c| format!(" {c}")).unwrap_or_default();
        wire.extend_from_slice(format!("VALUE {key} 0 {}{unique}\r\n", value.len()).as_bytes());
        wire.extend_from_slice(&value);
        wire.extend_from_slice(b"\r\n");
        read.push(Item { key, value, cas });
    }
    Reply::Values(read)
}

/// Reads `wire` as `batch`'s replies: one per command, values within the cap, or an error.
fn check_replies(batch: &Batch, wire: &[u8]) {
    let rt = runtime();
    let mut reader = tokio::io::BufReader::new(wire);
    if let Ok(replies) = rt.block_on(batch.read_replies(&mut reader)) {
        assert_eq!(replies.len(), batch.len());
        for r in &replies {
            if let Reply::Values(items) = r {
                assert!(items.iter().all(|it| it.value.len() <= MAX_VALUE_BYTES));
            }
        }
    }
}

/// The first byte of a cargo-fuzz input whose rest is a DNS answer; bytes below it name the
/// commands of a batch.
const SRV_INPUT: u8 = 6;

/// The most commands one cargo-fuzz input names.
const MAX_FUZZ_COMMANDS: usize = 8;

/// The command byte `kind` names in a cargo-fuzz input, in [`Exchange`]'s order.
fn command(kind: u8) -> Exchange {
    match kind {
        0 => Exchange::Get(Vec::new()),
        1 => Exchange::Gets(None),
        2 => Exchange::Incr(None),
        3 => Exchange::Add(false),
        4 => Exchange::Cas(0),
        _ => Exchange::Delete(false),
    }
}

/// One cargo-fuzz input (`fuzz/fuzz_targets/memcache.rs`). A first byte [`SRV_INPUT`] makes the
/// rest a DNS answer to the SRV query whose id is the answer's own (its first two bytes).
/// Otherwise the leading bytes 0-5 (up to eight) name the batch's commands (get, gets, incr,
/// add, cas, delete; a get when none is named) and the rest is memcached's reply to it.
pub fn check_fuzz_input(data: &[u8]) {
    if let Some((&SRV_INPUT, answer)) = data.split_first() {
        let id = |i: usize| answer.get(i).copied().unwrap_or(0);
        drop(decode_srv(answer, u16::from_be_bytes([id(0), id(1)])));
        return;
    }
    let named = data
        .iter()
        .take(MAX_FUZZ_COMMANDS)
        .take_while(|b| **b < SRV_INPUT)
        .count();
    let (kinds, wire) = data.split_at(named);
    let model: Vec<Exchange> = match kinds {
        [] => vec![command(0)],
        kinds => kinds.iter().map(|k| command(*k)).collect(),
    };
    let (batch, _, _) = exchanges(&model);
    check_replies(&batch, wire);
}

/// An SRV answer to query `id` for `_memcache._tcp.example.test`, its targets compressed
/// against the question's `example.test`, as a nameserver writes it.
fn srv_answer(id: u16, records: &[(u16, String)]) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&id.to_be_bytes());
    m.extend_from_slice(&[0x81, 0x80, 0, 1]);
    m.extend_from_slice(&(records.len() as u16).to_be_bytes());
    m.extend_from_slice(&[0, 0, 0, 0]);
    for label in ["_memcache", "_tcp", "example", "test"] {
        m.push(label.len() as u8);
        m.extend_from_slice(label.as_bytes());
    }
    m.extend_from_slice(&[0, 0, 33, 0, 1]);
    for (port, host) in records {
        m.extend_from_slice(&[0xc0, 12, 0, 33, 0, 1, 0, 0, 0, 30]);
        let mut rdata = vec![0, 10, 0, 5];
        rdata.extend_from_slice(&port.to_be_bytes());
        rdata.push(host.len() as u8);
        rdata.extend_from_slice(host.as_bytes());
        rdata.extend_from_slice(&[0xc0, 12 + 10 + 5]);
        m.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        m.extend_from_slice(&rdata);
    }
    m
}

/// Tokens of DNS messages a mutation may insert: compression pointers, long labels, counts.
const DNS_TOKENS: &[&[u8]] = &[
    b"\xc0\x0c",
    b"\xc0\xff",
    b"\x3f",
    b"\xff\xff",
    b"\x00\x21",
    b"\x00",
];

proptest! {
    #![proptest_config(proptest_config(512, "proptest-regressions/fuzz/memcache.txt"))]

    #[test]
    fn memcached_replies_read_back_as_written(model in proptest::collection::vec(exchange(), 1..6)) {
        let (batch, wire, expected) = exchanges(&model);
        let rt = runtime();
        let mut reader = tokio::io::BufReader::new(wire.as_slice());
        let got = rt.block_on(batch.read_replies(&mut reader)).expect("a valid reply reads");
        prop_assert_eq!(got, expected);
    }

    #[test]
    fn mutated_memcached_replies_are_read_or_refused(
        model in proptest::collection::vec(exchange(), 1..6),
        edits in mutations(4),
    ) {
        let (batch, mut wire, _) = exchanges(&model);
        apply(&mut wire, &edits, REPLY_TOKENS);
        timed("memcache mutated", || check_replies(&batch, &wire));
    }

    /// Raw replies to a batch of one or two commands, as the cargo-fuzz target reads them.
    #[test]
    fn raw_bytes_as_memcached_replies_never_panic(
        kinds in proptest::collection::vec(0..SRV_INPUT, 1..3),
        raw in raw_bytes(512),
    ) {
        let input = [kinds, raw].concat();
        timed("memcache raw", || check_fuzz_input(&input));
    }

    #[test]
    fn srv_answers_decode_to_their_records(
        id in any::<u16>(),
        records in proptest::collection::vec((any::<u16>(), "[a-z0-9-]{1,20}"), 0..8),
    ) {
        let m = srv_answer(id, &records);
        let got = decode_srv(&m, id).expect("a valid answer decodes");
        let want: Vec<(String, u16)> =
            records.iter().map(|(p, h)| (format!("{h}.example.test"), *p)).collect();
        prop_assert_eq!(got, want);
    }

    #[test]
    fn mutated_srv_answers_never_panic(
        records in proptest::collection::vec((any::<u16>(), "[a-z0-9-]{1,20}"), 0..8),
        edits in mutations(4),
        raw in raw_bytes(512),
    ) {
        let mut m = srv_answer(7, &records);
        apply(&mut m, &edits, DNS_TOKENS);
        timed("srv mutated", || drop(decode_srv(&m, 7)));
        let input = [vec![SRV_INPUT], raw].concat();
        timed("srv raw", || check_fuzz_input(&input));
    }
}
