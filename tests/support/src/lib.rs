//! What Sluice's tests, benchmarks and measuring programs share, in one dev-only crate rather
//! than files included by path: each takes what it needs with `use sluice_test_support::...`.
//!
//! - [`process`]: the end-to-end tests' rules for real processes: an outside program found, or
//!   the test failed (or skipped, on record); free loopback ports; bounded waits; window timing.
//! - [`http`]: the one small HTTP/1.1 client, blocking for the end-to-end tests and async for
//!   the in-process ones, sharing how a request is written and an answer read.
//! - [`app`]: Sluice started in this process on port 0 with a manual clock (`tests/`).
//! - [`pki`]: a throw-away certificate authority for every TLS test.
//! - [`rlqs_envoy`]: an Envoy's Rate Limit Quota Service stream (cluster and fault tests).
//! - [`delay_proxy`]: the fault harness's delay proxy (fault and region tests).
//! - [`store_contract`]: what every counter store answers, checked against a reference model,
//!   run by [`store_contract!`] on each backend (`tests/stores.rs`, `integration/redis.rs`,
//!   `integration/memcached.rs`).
//! - [`bench`]: the measuring programs' helpers (`bench/programs/`, `benches/`).

pub mod app;
pub mod bench;
pub mod delay_proxy;
pub mod http;
pub mod pki;
pub mod process;
pub mod rlqs_envoy;
pub mod store_contract;
