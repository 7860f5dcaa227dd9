//! The epoch-aligned fixed window of envoyproxy/ratelimit.
