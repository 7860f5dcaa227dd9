//! cargo-fuzz target: `/nginx` subrequest headers and `/forward-auth` calls.
//! The input's layout and the checks are those of `check_fuzz_input` in tests/fuzz/nginx.rs,
//! which CI runs on stable with proptest.
#![no_main]
// The proptest properties of the included files are test-only, so their helpers go unused here.
#![allow(dead_code, unused_imports)]

#[path = "../../tests/fuzz/mutate.rs"]
mod mutate;
#[path = "../../tests/fuzz/nginx.rs"]
mod nginx;
#[path = "../../tests/fuzz/support.rs"]
mod support;

libfuzzer_sys::fuzz_target!(|data: &[u8]| nginx::check_fuzz_input(data));
