//! cargo-fuzz target: xDS RateLimitConfig resources.
//! The checks are those of tests/fuzz/xds.rs, which CI runs with proptest.
#![no_main]
#![allow(dead_code, unused_imports)]

#[path = "../../tests/fuzz/mutate.rs"]
mod mutate;
#[path = "../../tests/fuzz/support.rs"]
mod support;
#[path = "../../tests/fuzz/xds.rs"]
mod xds;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let resource = envoy_types::pb::google::protobuf::Any {
        type_url: sluice::xds::TYPE_URL.to_owned(),
        value: data.to_vec(),
    };
    xds::check_resources(&[resource], false);
});
