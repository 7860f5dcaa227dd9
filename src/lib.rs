//! Sluice: an external rate-limit service for Envoy and nginx.
//!
//! A request flows one way:
//!
//! ```text
//! api (decode) -> config (lookup: matched limits) -> store (apply hits, using limiter) -> api (encode)
//! ```
//!
//! - [`config`]: YAML config -> validated lookup table; loading and hot reload.
//! - [`descriptor`]: the decoded request, free of any protocol types.
//! - [`limiter`]: the algorithms, pure functions of `(state, now, hits, limit)`.

pub mod config;
pub mod descriptor;
pub mod limiter;
