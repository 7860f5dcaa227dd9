//! cargo-fuzz target: peer Apply message bodies.
//! The checks are those of tests/fuzz/peer.rs, which CI runs with proptest.
#![no_main]
#![allow(dead_code, unused_imports)]

#[path = "../../tests/fuzz/mutate.rs"]
mod mutate;
#[path = "../../tests/fuzz/peer.rs"]
mod peer;
#[path = "../../tests/fuzz/support.rs"]
mod support;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    // The first 8 bytes set the owner's clock; the rest is the message.
    let (now, message) = data.split_at(data.len().min(8));
    let mut word = [0u8; 8];
    word[..now.len()].copy_from_slice(now);
    peer::check_apply(message, u64::from_le_bytes(word));
});
