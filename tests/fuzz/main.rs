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
//! a broken invariant, so the coverage-guided harness in `fuzz/` (cargo-fuzz, nightly, outside
//! the workspace) runs the very same checks.

mod config;
mod json;
mod memcache;
mod mutate;
mod nginx;
mod peer;
mod proto;
mod support;
mod xds;
