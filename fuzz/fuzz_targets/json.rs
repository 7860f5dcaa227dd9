//! cargo-fuzz target: `/json` request bodies.
//! The input's layout and the checks are those of `check_fuzz_input` in tests/fuzz/json.rs,
//! which CI runs on stable with proptest.
#![no_main]
// The proptest properties of the included files are test-only, so their helpers go unused here.
#![allow(dead_code, unused_imports)]

#[path = "../../tests/fuzz/json.rs"]
mod json;
#[path = "../../tests/fuzz/mutate.rs"]
mod mutate;
#[path = "../../tests/fuzz/proto.rs"]
mod proto;
#[path = "../../tests/fuzz/support.rs"]
mod support;

libfuzzer_sys::fuzz_target!(|data: &[u8]| json::check_fuzz_input(data));
