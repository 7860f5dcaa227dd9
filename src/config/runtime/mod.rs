//! Runtime limits (issue 38): limits set through the API at a descriptor path, over the YAML.
//!
//! A runtime limit is checked as the YAML would check it: its path and its JSON body (the fields
//! of a `rate_limit`) make the one-file document that would hold them, which [`super::raw`] and
//! [`super::build`] then check, so every message is the YAML's, word for word. The document is
//! built as a value, not as text: nothing in a key, value or body can break out of its place,
//! and no YAML text is parsed (100,000 limits load in well under a second).
//!
//! [`layer`] keeps each domain's runtime limits as a tree matched with the YAML's
//! ([`super::lookup`]); [`state`] composes the served config of the two; [`digest`] counts
//! and sums them as they change, for peers to compare.

pub mod digest;
pub mod file;
pub mod state;

use serde_yaml_ng::{Mapping, Value as Yaml};

use super::build::Builder;
use super::limit::Source;
use super::lookup::RateLimitConfig;
use super::raw;

pub(crate) use super::runtime_layer::{PathLevel, RuntimeLimit, Stamp};
pub(crate) use super::runtime_layer::{RuntimeLayer, composite};
pub(crate) use digest::Digest;
pub use state::Change;
pub(crate) use state::{Applied, PutError, RuntimeState, TOMBSTONE_LIFE_US};

/// The YAML document of one runtime limit: `domain`, one nested descriptor per level, the
/// body's fields in the last level (its `rate_limit`'s fields as its `rate_limit`).
pub(crate) fn document(
    domain: &str,
    levels: &[PathLevel<'_>],
    body: &serde_json::Value,
) -> Result<Yaml, String> {
    if !body.is_object() {
        return Err("the body must be a JSON object of rate_limit fields".to_owned());
    }
    let mut below: Option<Yaml> = None;
    for (key, value) in levels.iter().rev() {
        let mut node = Mapping::new();
        node.insert("key".into(), (*key).into());
        if let Some(value) = value {
            node.insert("value".into(), (*value).into());
        }
        match below.take() {
            None => put_body(&mut node, body),
            Some(child) => {
                node.insert("descriptors".into(), Yaml::Sequence(vec![child]));
            }
        };
        below = Some(Yaml::Mapping(node));
    }
    let mut doc = Mapping::new();
    doc.insert("domain".into(), domain.into());
    doc.insert(
        "descriptors".into(),
        Yaml::Sequence(below.into_iter().collect()),
    );
    Ok(Yaml::Mapping(doc))
}

/// The body's fields that belong to the descriptor in the YAML (the rest are its
/// `rate_limit`'s): a runtime limit's body holds both, as one object.
const DESCRIPTOR_FIELDS: [&str; 7] = [
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    "rate_limits",
];

/// Puts the body's fields in the last level's descriptor: its own fields there, the others
/// as its `rate_limit` (none when there are none: `rate_limits` alone, or an empty body).
fn put_body(node: &mut Mapping, body: &serde_json::Value) {
    let mut rate_limit = Mapping::new();
    for (k, v) in body.as_object().into_iter().flatten() {
        if DESCRIPTOR_FIELDS.contains(&k.as_str()) {
            node.insert(k.as_str().into(), yaml_of(v));
        } else {
            rate_limit.insert(k.as_str().into(), yaml_of(v));
        }
    }
    if !rate_limit.is_empty() {
        node.insert("rate_limit".into(), Yaml::Mapping(rate_limit));
    }
}

/// A JSON value as the YAML value of the same text.
fn yaml_of(json: &serde_json::Value) -> Yaml {
    use serde_json::Value as J;
    match json {
        J::Null => Yaml::Null,
        J::Bool(b) => Yaml::Bool(*b),
        J::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => u.into(),
            (None, Some(i)) => i.into(),
            (None, None) => n.as_f64().unwrap_or(f64::NAN).into(),
        },
        J::String(s) => s.as_str().into(),
        J::Array(items) => Yaml::Sequence(items.iter().map(yaml_of).collect()),
        J::Object(map) => Yaml::Mapping(
            map.iter()
                .map(|(k, v)| (Yaml::from(k.as_str()), yaml_of(v)))
                .collect(),
        ),
    }
}

/// Checks one runtime limit; on success, the config that holds it alone.
pub(crate) fn check(
    domain: &str,
    levels: &[PathLevel<'_>],
    body: &serde_json::Value,
) -> Result<RateLimitConfig, String> {
    if levels.is_empty() {
        return Err("a runtime limit needs at least one descriptor level".to_owned());
    }
    let doc = document(domain, levels, body)?;
    let mut builder = Builder::new(&super::LoadOptions::default());
    builder.add_file(raw::parse_value(doc)?)?;
    Ok(builder.finish())
}

/// The most runtime limits a node holds, all domains together (SLUICE_MAX_RUNTIME_LIMITS);
/// past it a new path is refused and a change to an existing one still applies.
pub(crate) const DEFAULT_MAX_RUNTIME_LIMITS: usize = 1_000_000;

/// One change to a runtime limit as it is saved and shared between nodes: the path, the new
/// body (`None`: removed) and its stamp. Saved one a line in SLUICE_RUNTIME_LIMITS_PATH, kept
/// in Redis, and sent in the peer protocol's `Limits` call.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Replicated {
    pub domain: String,
    pub levels: Vec<(String, Option<String>)>,
    #[serde(rename = "limit")]
    pub body: Option<serde_json::Value>,
    #[serde(default)]
    pub at_us: u64,
    #[serde(default)]
    pub origin: String,
}

impl Replicated {
    pub fn path(&self) -> Vec<PathLevel<'_>> {
        self.levels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_deref()))
            .collect()
    }

    pub fn stamp(&self) -> Stamp {
        Stamp {
            at_us: self.at_us,
            origin: self.origin.as_str().into(),
        }
    }

    /// A limit as set, as a change.
    pub fn of(domain: &str, limit: &RuntimeLimit) -> Self {
        Replicated {
            domain: domain.to_owned(),
            levels: limit
                .levels
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_deref().map(str::to_owned)))
                .collect(),
            body: Some(limit.body.clone()),
            at_us: limit.stamp.at_us,
            origin: limit.stamp.origin.to_string(),
        }
    }

    /// The key that names its path among every domain's: the domain, a newline, the path as
    /// the API's URL writes it (both unambiguous: a domain holds no newline in a URL).
    pub fn key(&self) -> String {
        path_key(&self.domain, &self.path())
    }
}

/// The key of a domain's path: `domain`, a newline, [`path_text`].
pub(crate) fn path_key(domain: &str, levels: &[PathLevel<'_>]) -> String {
    format!("{domain}\n{}", path_text(levels))
}

/// A path's levels as the API's URL writes them: `k=v` or `k`, percent-encoded, joined by `/`.
pub(crate) fn path_text(levels: &[PathLevel<'_>]) -> String {
    let encode = |s: &str| crate::percent::encode(s, b"");
    levels
        .iter()
        .map(|(k, v)| match v {
            Some(v) => format!("{}={}", encode(k), encode(v)),
            None => encode(k),
        })
        .collect::<Vec<_>>()
        .join("/")
}

impl RuntimeLimit {
    /// The path's levels as borrowed pairs.
    pub fn path(&self) -> Vec<PathLevel<'_>> {
        self.levels
            .iter()
            .map(|(k, v)| (&**k, v.as_deref()))
            .collect()
    }
}

/// Checks one runtime limit and compiles it: the YAML's checks, then the runtime's own rules
/// (no `*` in a value: wildcards come from the YAML).
pub(crate) fn compile(
    domain: &str,
    levels: &[PathLevel<'_>],
    body: serde_json::Value,
    stamp: Stamp,
) -> Result<RuntimeLimit, String> {
    if let Some((key, value)) = levels
        .iter()
        .find_map(|(k, v)| v.filter(|v| v.contains('*')).map(|v| (k, v)))
    {
        return Err(format!(
            "{key}={value}: a runtime limit's value cannot contain '*' (wildcards come from the YAML; set the limit per value)"
        ));
    }
    let cfg = check(domain, levels, &body)?;
    let mut limit = cfg
        .limits()
        .next()
        .cloned()
        .ok_or_else(|| "the body sets no rate limit".to_owned())?;
    limit.source = Source::Runtime;
    Ok(RuntimeLimit {
        levels: levels
            .iter()
            .map(|(k, v)| ((*k).into(), v.map(Into::into)))
            .collect(),
        body,
        limit,
        stamp,
    })
}

#[cfg(test)]
mod tests;
