//! cargo-fuzz target: /nginx subrequest headers.
//! The checks are those of tests/fuzz/nginx.rs, which CI runs with proptest.
#![no_main]
#![allow(dead_code, unused_imports)]

#[path = "../../tests/fuzz/mutate.rs"]
mod mutate;
#[path = "../../tests/fuzz/nginx.rs"]
mod nginx;
#[path = "../../tests/fuzz/support.rs"]
mod support;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    // Lines are X-Sluice-Domain, X-Sluice-Descriptor (any number of them), and a line starting
    // with '#' is X-Sluice-Hits-Addend.
    let mut values = Vec::new();
    for (i, line) in data.split(|b| *b == b'\n').enumerate() {
        let name = match (i, line.first()) {
            (_, Some(b'#')) => sluice::api::nginx::HITS_ADDEND_HEADER,
            (0, _) => sluice::api::nginx::DOMAIN_HEADER,
            _ => sluice::api::nginx::DESCRIPTOR_HEADER,
        };
        let line = if name == sluice::api::nginx::HITS_ADDEND_HEADER {
            &line[1..]
        } else {
            line
        };
        values.push((name, line.to_vec()));
    }
    nginx::check_endpoint(&nginx::raw_headers(&values));
});
