//! Sluice: an external rate-limit service for Envoy and nginx.
//!
//! A request flows one way:
//!
//! ```text
//! api (decode) -> config (lookup: matched limits) -> store (apply hits, using limiter) -> api (encode)
//! ```
//!
//! - [`api`]: adapters between wire formats and the domain types ([`api::json`]: proto3 JSON for `/json`).
//! - [`descriptor`]: the decoded request, free of any protocol types.
//! - [`limiter`]: the algorithms, pure functions of `(state, now, hits, limit)`.

pub mod api;
pub mod descriptor;
pub mod limiter;
