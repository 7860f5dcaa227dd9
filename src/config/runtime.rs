//! A runtime limit (issue 38), checked as the YAML would check it: its descriptor path and its
//! JSON body (the fields of a `rate_limit`) are written as the one-file document that would
//! hold them, which [`super::raw`] and [`super::build`] then parse and check, so every message
//! is the YAML's, word for word.

use super::build::Builder;
use super::lookup::RateLimitConfig;
use super::raw;

/// One level of a runtime limit's path: a key, and its value unless the node is key-only.
pub(crate) type PathLevel<'a> = (&'a str, Option<&'a str>);

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

/// The most runtime limits a node holds, all domains together (SLUICE_MAX_RUNTIME_LIMITS, to
/// come); past it a new path is refused and a change to an existing one still applies.
pub(crate) const DEFAULT_MAX_RUNTIME_LIMITS: usize = 1_000_000;

/// One runtime limit as set: its path, the body as given (what `GET` answers), and the limit
/// the body compiles to.
#[derive(Clone, Debug)]
pub(crate) struct RuntimeLimit {
    pub(crate) levels: Vec<(String, Option<String>)>,
    pub(crate) body: serde_json::Value,
    pub(crate) limit: std::sync::Arc<super::Limit>,
}

/// What a `PUT` did: made a new path (201) or replaced the limit it had (200), with the old
/// body for the audit log.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Put {
    Created,
    Replaced { old: serde_json::Value },
}

/// Why a `PUT` was refused (beyond the checks of [`check`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PutError {
    #[error("{0}")]
    Invalid(String),
    #[error("the node holds its maximum of {max} runtime limits (SLUICE_MAX_RUNTIME_LIMITS)")]
    Full { max: usize },
}

/// The path's key in the table: Go's full key below the domain (`k1_v1.k2`), which two paths
/// share only when the YAML would call them duplicates.
fn path_key(levels: &[PathLevel<'_>]) -> String {
    let mut out = String::new();
    for (i, (k, v)) in levels.iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        out.push_str(k);
        if let Some(v) = v.filter(|v| !v.is_empty()) {
            out.push('_');
            out.push_str(v);
        }
    }
    out
}

/// Every runtime limit of a node, per domain and path, sharded for many writers.
pub(crate) struct RuntimeLimits {
    table: dashmap::DashMap<(String, String), RuntimeLimit>,
    max: usize,
}

impl RuntimeLimits {
    pub(crate) fn new(max: usize) -> Self {
        RuntimeLimits {
            table: dashmap::DashMap::new(),
            max,
        }
    }

    /// Checks and sets the limit at `levels` of `domain`.
    pub(crate) fn put(
        &self,
        domain: &str,
        levels: &[PathLevel<'_>],
        body: serde_json::Value,
    ) -> Result<Put, PutError> {
        let cfg = check(domain, levels, &body).map_err(PutError::Invalid)?;
        let limit = cfg
            .limits()
            .next()
            .cloned()
            .ok_or_else(|| PutError::Invalid("the body sets no rate limit".to_owned()))?;
        let entry = RuntimeLimit {
            levels: levels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.map(str::to_owned)))
                .collect(),
            body,
            limit: std::sync::Arc::new(limit),
        };
        let key = (domain.to_owned(), path_key(levels));
        if !self.table.contains_key(&key) && self.table.len() >= self.max {
            return Err(PutError::Full { max: self.max });
        }
        Ok(match self.table.insert(key, entry) {
            None => Put::Created,
            Some(old) => Put::Replaced { old: old.body },
        })
    }

    /// The limit at `levels` of `domain`, as set.
    pub(crate) fn get(&self, domain: &str, levels: &[PathLevel<'_>]) -> Option<RuntimeLimit> {
        let key = (domain.to_owned(), path_key(levels));
        self.table.get(&key).map(|e| e.value().clone())
    }

    /// Removes the limit at `levels` of `domain`; its body, if there was one.
    pub(crate) fn remove(
        &self,
        domain: &str,
        levels: &[PathLevel<'_>],
    ) -> Option<serde_json::Value> {
        let key = (domain.to_owned(), path_key(levels));
        self.table.remove(&key).map(|(_, e)| e.body)
    }

    /// A domain's runtime limits, sorted by path.
    pub(crate) fn list(&self, domain: &str) -> Vec<(String, RuntimeLimit)> {
        let mut out: Vec<(String, RuntimeLimit)> = self
            .table
            .iter()
            .filter(|e| e.key().0 == domain)
            .map(|e| (e.key().1.clone(), e.value().clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptor::Entry;
    use serde_json::json;

    #[test]
    fn a_runtime_limit_is_the_limit_its_yaml_would_be() {
        let cfg = check(
            "edge",
            &[
                ("tenant", Some("acme")),
                ("path", Some("/api: \"v1\"\n- x")),
            ],
            &json!({"unit": "minute", "requests_per_unit": 2, "algorithm": "token_bucket"}),
        )
        .unwrap();
        let entries = [
            Entry::new("tenant", "acme"),
            Entry::new("path", "/api: \"v1\"\n- x"),
        ];
        let matched = cfg.domain("edge").unwrap().lookup(&entries).unwrap();
        assert_eq!(
            matched.limit.full_key,
            "edge.tenant_acme.path_/api: \"v1\"\n- x"
        );
        assert_eq!(
            format!("{:?}", matched.limit.slowest_block().unwrap().algorithm),
            "TokenBucket"
        );
    }

    #[test]
    fn its_errors_are_the_yamls() {
        let err = |body: serde_json::Value| check("d", &[("k", None)], &body).unwrap_err();
        assert_eq!(
            err(json!({"unit": "minutes", "requests_per_unit": 1})),
            "invalid rate limit unit 'minutes'"
        );
        assert_eq!(
            err(json!({"unit": "day", "unlimited": true})),
            "should not specify rate limit unit when unlimited"
        );
        assert_eq!(
            err(json!([1])),
            "the body must be a JSON object of rate_limit fields"
        );
        assert_eq!(
            check("d", &[], &json!({})).unwrap_err(),
            "a runtime limit needs at least one descriptor level"
        );
    }

    #[test]
    fn limits_are_set_replaced_listed_and_removed_within_the_cap() {
        let limits = RuntimeLimits::new(2);
        let acme = [("tenant", Some("acme"))];
        let body = json!({"unit": "minute", "requests_per_unit": 2});
        assert_eq!(limits.put("edge", &acme, body.clone()), Ok(Put::Created));
        let raised = json!({"unit": "minute", "requests_per_unit": 20});
        assert_eq!(
            limits.put("edge", &acme, raised.clone()),
            Ok(Put::Replaced { old: body })
        );
        let got = limits.get("edge", &acme).unwrap();
        assert_eq!(got.body, raised);
        assert_eq!(got.limit.full_key, "edge.tenant_acme");
        let other = [("tenant", Some("other")), ("path", None)];
        assert_eq!(limits.put("edge", &other, raised.clone()), Ok(Put::Created));
        // Full: a new path is refused, a change to an existing one applies.
        let third = [("tenant", Some("third"))];
        assert_eq!(
            limits.put("edge", &third, raised.clone()),
            Err(PutError::Full { max: 2 })
        );
        assert!(limits.put("edge", &acme, raised.clone()).is_ok());
        let paths: Vec<String> = limits.list("edge").into_iter().map(|(p, _)| p).collect();
        assert_eq!(paths, ["tenant_acme", "tenant_other.path"]);
        assert!(limits.list("other").is_empty());
        assert_eq!(limits.remove("edge", &acme), Some(raised));
        assert_eq!(limits.remove("edge", &acme), None);
        assert_eq!(limits.len(), 1);
        assert_eq!(
            limits.put("edge", &third, json!({"unit": "fortnight"})),
            Err(PutError::Invalid(
                "invalid rate limit unit 'fortnight'".to_owned()
            ))
        );
    }
}
