//! Sluice: an external rate-limit service for Envoy and nginx.
//!
//! A request flows one way:
//!
//! ```text
//! api (decode) -> config (lookup: matched limits) -> store (apply hits, using limiter) -> api (encode)
//! ```
//!
//! - [`descriptor`]: the decoded request, free of any protocol types.
//! - [`limiter`]: the algorithms, pure functions of `(state, now, hits, limit)`.
//! - [`settings`]: CLI flags and the envoyproxy/ratelimit environment variables, validated once.

pub mod descriptor;
pub mod limiter;
pub mod settings;
