//! cargo-fuzz target: xDS RateLimitConfig resources.
//! The input's layout and the checks are those of `check_fuzz_input` in tests/fuzz/xds.rs,
//! which CI runs on stable with proptest.
#![no_main]
// The proptest properties of the included files are test-only, so their helpers go unused here.
#![allow(dead_code, unused_imports)]

#[path = "../../tests/fuzz/mutate.rs"]
mod mutate;
#[path = "../../tests/fuzz/support.rs"]
mod support;
#[path = "../../tests/fuzz/xds.rs"]
mod xds;

libfuzzer_sys::fuzz_target!(|data: &[u8]| xds::check_fuzz_input(data));
