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
}
