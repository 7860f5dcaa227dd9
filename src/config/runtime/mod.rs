//! A runtime limit (issue 38), checked as the YAML would check it: its descriptor path and its
//! JSON body (the fields of a `rate_limit`) are written as the one-file document that would
//! hold them, which [`super::raw`] and [`super::build`] then parse and check, so every message
//! is the YAML's, word for word.

pub(crate) mod layer;
pub mod state;

use super::build::Builder;
use super::lookup::{Limit, RateLimitConfig, Source};
use super::raw;

pub(crate) use layer::RuntimeLayer;
pub use state::{Change, PutError, RuntimeState};

/// One level of a runtime limit's path: a key, and its value unless the node is key-only.
pub type PathLevel<'a> = (&'a str, Option<&'a str>);

/// The YAML document of one runtime limit: `domain`, one nested descriptor per level, the
/// body as the last level's `rate_limit`. JSON strings are YAML double-quoted scalars and a
/// JSON object is a YAML flow mapping, so nothing in a key, value or body can break out of
/// its place.
pub(crate) fn document(
    domain: &str,
    levels: &[PathLevel<'_>],
    body: &serde_json::Value,
) -> Result<String, String> {
    if !body.is_object() {
        return Err("the body must be a JSON object of rate_limit fields".to_owned());
    }
    let quote = |s: &str| serde_json::Value::from(s).to_string();
    let mut doc = format!("domain: {}\ndescriptors:\n", quote(domain));
    for (depth, (key, value)) in levels.iter().enumerate() {
        let indent = "  ".repeat(2 * depth + 1);
        doc.push_str(&format!("{indent}- key: {}\n", quote(key)));
        if let Some(value) = value {
            doc.push_str(&format!("{indent}  value: {}\n", quote(value)));
        }
        if depth + 1 < levels.len() {
            doc.push_str(&format!("{indent}  descriptors:\n"));
        } else {
            doc.push_str(&format!("{indent}  rate_limit: {body}\n"));
        }
    }
    Ok(doc)
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
    let mut builder = Builder::new(false);
    builder.add_file(raw::parse(&doc)?)?;
    Ok(builder.finish())
}

/// The most runtime limits a node holds, all domains together (SLUICE_MAX_RUNTIME_LIMITS);
/// past it a new path is refused and a change to an existing one still applies.
pub const DEFAULT_MAX_RUNTIME_LIMITS: usize = 1_000_000;

/// One runtime limit as set: its path, the body as given (what `GET` answers), and the limit
/// the body compiles to.
#[derive(Debug)]
pub struct RuntimeLimit {
    pub levels: Box<[(Box<str>, Option<Box<str>>)]>,
    pub body: serde_json::Value,
    pub limit: Limit,
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

/// The composite key of a level, as the YAML tree keys its nodes: `key`, or `key_value`.
pub(crate) fn composite<'a>(key: &'a str, value: Option<&str>) -> std::borrow::Cow<'a, str> {
    match value {
        Some(v) => format!("{key}_{v}").into(),
        None => key.into(),
    }
}

/// Checks one runtime limit and compiles it: the YAML's checks, then the runtime's own rules
/// (no `*` in a value: wildcards come from the YAML).
pub(crate) fn compile(
    domain: &str,
    levels: &[PathLevel<'_>],
    body: serde_json::Value,
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
    })
}

#[cfg(test)]
mod tests;
