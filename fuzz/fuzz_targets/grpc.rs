//! cargo-fuzz target: gRPC ShouldRateLimit message bodies.
//! The checks are those of tests/fuzz/proto.rs, which CI runs with proptest.
#![no_main]
#![allow(dead_code, unused_imports)]

#[path = "../../tests/fuzz/mutate.rs"]
mod mutate;
#[path = "../../tests/fuzz/proto.rs"]
mod proto;
#[path = "../../tests/fuzz/support.rs"]
mod support;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    proto::check_grpc_bytes(data);
});
