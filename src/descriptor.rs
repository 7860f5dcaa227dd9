//! The request as the service sees it once `api` has decoded it: protocol-free domain types.
//!
//! `api` moves strings out of the protobuf or JSON message into these types (no copies); the
//! config lookup and the store read them; nothing here knows about tonic, axum or prost.

use crate::limiter::Unit;

/// One `key=value` pair of a descriptor.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Entry {
    pub key: String,
    pub value: String,
}

impl Entry {
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> Self {
        Entry {
            key: key.into(),
            value: value.into(),
        }
    }
}

/// A per-request limit sent by the client (`descriptor.limit`), replacing config matching.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitOverride {
    pub requests_per_unit: u32,
    pub unit: Unit,
}

/// One descriptor of a request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Descriptor {
    pub entries: Vec<Entry>,
    pub limit_override: Option<LimitOverride>,
    /// The per-descriptor `hits_addend`; when set (including 0) it wins over the request's.
    pub hits_addend: Option<u64>,
    /// `is_negative_hits`: the descriptor's hits come off its counters (a refund, floored at
    /// 0) instead of being charged, and it is answered OK whatever the counters hold.
    pub negative_hits: bool,
}

/// A decoded `ShouldRateLimit` request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    pub domain: String,
    pub descriptors: Vec<Descriptor>,
    /// The request-level addend; 0 means 1, as in the Go service.
    pub hits_addend: u32,
}

#[cfg(test)]
impl Request {
    /// Each descriptor's entries as `(key, value)` pairs, for tests' assertions.
    pub(crate) fn entry_pairs(&self) -> Vec<Vec<(&str, &str)>> {
        self.descriptors
            .iter()
            .map(|d| {
                d.entries
                    .iter()
                    .map(|e| (e.key.as_str(), e.value.as_str()))
                    .collect()
            })
            .collect()
    }
}
