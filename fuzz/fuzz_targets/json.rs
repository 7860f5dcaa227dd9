//! cargo-fuzz target: /json request bodies.
//! The checks are those of tests/fuzz/json.rs, which CI runs with proptest.
#![no_main]
#![allow(dead_code, unused_imports)]

#[path = "../../tests/fuzz/json.rs"]
mod json;
#[path = "../../tests/fuzz/mutate.rs"]
mod mutate;
#[path = "../../tests/fuzz/proto.rs"]
mod proto;
#[path = "../../tests/fuzz/support.rs"]
mod support;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    json::check_decode(data, 0x9e37_79b9_7f4a_7c15);
    json::check_endpoint(data);
});
