//! cargo-fuzz target: YAML config file text.
//! The checks are those of tests/fuzz/config.rs, which CI runs with proptest.
#![no_main]
#![allow(dead_code, unused_imports)]

#[path = "../../tests/fuzz/config.rs"]
mod config;
#[path = "../../tests/fuzz/mutate.rs"]
mod mutate;
#[path = "../../tests/fuzz/support.rs"]
mod support;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    // The first byte picks MERGE_DOMAIN_CONFIG; the rest is one file's bytes, loaded from disk
    // and from text.
    let Some((flags, bytes)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(bytes).into_owned();
    config::check_files(&[("f.yaml".to_owned(), text)], flags & 1 == 1, &[]);
    if flags & 2 == 2 {
        config::check_load(&[("f.yaml".to_owned(), bytes.to_vec())]);
    }
});
