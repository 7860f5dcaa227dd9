//! The `Limits` call's messages as the runtime limits' types: a change, and a digest.

use crate::cluster::peer::wire;
use crate::config::runtime::{Digest, Replicated};

pub(super) fn to_wire(c: &Replicated) -> wire::RuntimeLimitChange {
    wire::RuntimeLimitChange {
        domain: c.domain.clone(),
        levels: c
            .levels
            .iter()
            .map(|(key, value)| wire::RuntimeLevel {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
        body: c.body.as_ref().map(serde_json::Value::to_string),
        at_us: c.at_us,
        origin: c.origin.clone(),
    }
}

/// A peer's runtime limit change whose body is not JSON.
#[derive(Debug, thiserror::Error)]
#[error("a runtime limit's body is not JSON: {0}")]
pub(super) struct BadBody(#[from] serde_json::Error);

pub(super) fn from_wire(c: wire::RuntimeLimitChange) -> Result<Replicated, BadBody> {
    let body = c.body.map(|b| serde_json::from_str(&b)).transpose()?;
    Ok(Replicated {
        domain: c.domain,
        levels: c.levels.into_iter().map(|l| (l.key, l.value)).collect(),
        body,
        at_us: c.at_us,
        origin: c.origin,
    })
}

pub(super) fn digest_to_wire(d: Digest) -> wire::LimitsDigest {
    wire::LimitsDigest {
        entries: d.entries,
        sum: d.sum,
    }
}

pub(super) fn digest_from_wire(d: wire::LimitsDigest) -> Digest {
    Digest {
        entries: d.entries,
        sum: d.sum,
    }
}
