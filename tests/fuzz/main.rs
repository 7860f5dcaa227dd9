//! Fuzz targets for every parser that reads bytes Sluice did not write, run on stable Rust by
//! proptest: the YAML config loader ([`config`]), `/json` bodies ([`json`]), `/nginx` headers
//! ([`nginx`]), gRPC requests into the domain model and responses back out ([`proto`]), the peer
//! protocol ([`peer`]), xDS `RateLimitConfig` resources ([`xds`]), and memcached's replies and
//! the DNS answers of the memcache backend's SRV lookup ([`memcache`]).
//!
//! Each target checks one property: the code never panics, and it either refuses the input with
//! an error that names what was wrong, or yields a value that keeps the target's invariants (a
//! round trip, a count, a cap). Inputs come three ways, because random bytes rarely get past
//! the first parser: valid inputs built from a model (whose answer the model predicts), the
//! same inputs encoded and then mutated ([`mutate`]: bits flipped, bytes and syntax tokens
//! inserted, ranges deleted, duplicated or truncated), and raw bytes.
//!
//! `cargo test --test fuzz` (and so `.ci/run`) runs a few hundred cases per property, chosen
//! to keep the whole target well under a minute in a debug build. A long run:
//!
//! ```text
//! PROPTEST_CASES=200000 cargo test --release --test fuzz
//! ```
//!
//! A case slower than FUZZ_SLOW_MS (default 5000; try 1000 in release) fails as a finding,
//! since an input that takes seconds is a way to exhaust Sluice. proptest shrinks a failure and
//! saves its seed in `proptest-regressions/fuzz/<target>.txt`, which is replayed first on every
//! run: commit it with the fix. The targets' checks (`check_*`) take plain values and panic on
//! a broken invariant, so the coverage-guided harness in `fuzz/` (cargo-fuzz, outside the
//! workspace) runs the very same checks: each target here has a `check_fuzz_input`, which
//! reads one libFuzzer input (how its bytes split into the target's inputs) and which its
//! raw-bytes property calls, and `fuzz/fuzz_targets/<target>.rs` includes this file and calls
//! nothing else. `scripts/test.sh` type-checks `fuzz/` on stable.

mod config;
mod json;
mod memcache;
mod mutate;
mod nginx;
mod peer;
mod proto;
mod support;
mod xds;

/// Modules here that are not targets: this file and the shared helpers.
const NOT_TARGETS: &[&str] = &["main", "mutate", "support"];

/// Every target here has a cargo-fuzz target in `fuzz/` of the same name that calls its
/// `check_fuzz_input`, so neither side can gain a target the other lacks.
#[test]
fn every_target_has_a_cargo_fuzz_target() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("fuzz/Cargo.toml")).expect("fuzz/Cargo.toml");
    let mut targets = Vec::new();
    for entry in std::fs::read_dir(root.join("tests/fuzz")).expect("tests/fuzz") {
        let path = entry.expect("a directory entry").path();
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("a file name");
        if NOT_TARGETS.contains(&name) {
            continue;
        }
        let source = format!("fuzz_targets/{name}.rs");
        let text = std::fs::read_to_string(root.join("fuzz").join(&source))
            .unwrap_or_else(|e| panic!("fuzz/{source}: {e}"));
        assert!(
            text.contains(&format!("{name}::check_fuzz_input(data)")),
            "fuzz/{source} does not call {name}::check_fuzz_input"
        );
        let bin = format!("name = \"{name}\"\npath = \"{source}\"");
        assert!(
            manifest.contains(&bin),
            "fuzz/Cargo.toml has no [[bin]] {name}"
        );
        targets.push(name.to_owned());
    }
    // The list docs/hardening.md#fuzzing shows (and a guard against reading no directory).
    targets.sort();
    let listed = [
        "config", "json", "memcache", "nginx", "peer", "proto", "xds",
    ];
    assert_eq!(targets, listed);
}
