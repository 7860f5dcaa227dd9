//! One config file's text -> raw serde types, with envoyproxy/ratelimit's checks and messages.
//!
//! The Go service unmarshals each file twice: once into a generic map, which it walks to reject
//! unknown keys and odd value types, and once into its typed structs. We do the same, in the
//! same order, so the first error reported for a file is the one Go reports. The raw types
//! here are deliberately loose (everything optional, YAML 1.1-style scalars accepted where
//! go-yaml v2 accepts them); [`build`](super::build) turns them into validated types.

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use serde_yaml_ng::{Mapping, Value};
use std::fmt;

/// Keys the Go service accepts anywhere in a config file (its generic walk does not care at
/// which level a key appears; the typed pass then ignores misplaced ones, and so do we).
pub(crate) const VALID_KEYS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "shadow_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "quota_mode",
    "metadata",
    // Sluice extensions (see [`EXTENSION_KEYS`]).
    "value_regex",
    "algorithm",
    "burst",
    "charge_refused",
    "unit_multiplier",
    "safe_capacity",
    "time_zone",
    "week_start",
    "penalty_seconds",
    "penalty_extends",
    "rate_limits",
];

/// The keys Sluice accepts that envoyproxy/ratelimit does not: a file using any of them no
/// longer loads in the Go service (`check-config --strict-envoy` reports them).
pub(crate) const EXTENSION_KEYS: &[&str] = &[
    "value_regex",
    "algorithm",
    "burst",
    "charge_refused",
    "unit_multiplier",
    "safe_capacity",
    "time_zone",
    "week_start",
    "penalty_seconds",
    "penalty_extends",
    "rate_limits",
];

/// The key whose value is free-form: its contents are not walked.
const METADATA_KEY: &str = "metadata";

/// A whole config file.
#[derive(Debug, Default, Deserialize)]
pub struct RawRoot {
    #[serde(default, deserialize_with = "lenient_string")]
    pub domain: String,
    #[serde(default, deserialize_with = "null_default")]
    pub descriptors: Vec<RawDescriptor>,
}

/// One entry of a `descriptors` list.
#[derive(Debug, Default, Deserialize)]
pub struct RawDescriptor {
    #[serde(default, deserialize_with = "lenient_string")]
    pub key: String,
    #[serde(default, deserialize_with = "lenient_string")]
    pub value: String,
    /// Sluice extension: a regular expression the request's whole value must match, instead
    /// of `value`; `None` when absent or null.
    #[serde(default, deserialize_with = "lenient_opt")]
    pub value_regex: Option<String>,
    #[serde(default)]
    pub rate_limit: Option<RawRateLimit>,
    /// Sluice extension: several limits, all enforced. `None` when absent (or null), so that an
    /// explicit empty list can be rejected.
    #[serde(default)]
    pub rate_limits: Option<Vec<RawRateLimit>>,
    #[serde(default, deserialize_with = "null_default")]
    pub descriptors: Vec<RawDescriptor>,
    #[serde(default, deserialize_with = "lenient_bool")]
    pub shadow_mode: bool,
    #[serde(default, deserialize_with = "lenient_bool")]
    pub quota_mode: bool,
    #[serde(default, deserialize_with = "lenient_bool")]
    pub detailed_metric: bool,
    #[serde(default, deserialize_with = "lenient_bool")]
    pub value_to_metric: bool,
    #[serde(default, deserialize_with = "lenient_bool")]
    pub share_threshold: bool,
    /// Free-form; converted to JSON (and checked) by `build`.
    #[serde(default)]
    pub metadata: Option<Value>,
}

/// A `rate_limit` block.
#[derive(Debug, Default, Deserialize)]
pub struct RawRateLimit {
    #[serde(default, deserialize_with = "null_default")]
    pub requests_per_unit: u32,
    #[serde(default, deserialize_with = "lenient_string")]
    pub unit: String,
    #[serde(default, deserialize_with = "lenient_bool")]
    pub unlimited: bool,
    #[serde(default, deserialize_with = "lenient_string")]
    pub name: String,
    #[serde(default, deserialize_with = "null_default")]
    pub replaces: Vec<RawReplaces>,
    /// Sluice extension; `None` when absent or null (then `fixed_window`).
    #[serde(default, deserialize_with = "lenient_opt")]
    pub algorithm: Option<String>,
    /// Sluice extension; `None` when absent or null.
    #[serde(default)]
    pub burst: Option<u32>,
    /// Sluice extension; `None` when absent or null (then the algorithm's default).
    #[serde(default, deserialize_with = "lenient_opt")]
    pub charge_refused: Option<bool>,
    /// Sluice extension: the window is this many units; `None` when absent or null (then 1).
    #[serde(default)]
    pub unit_multiplier: Option<u32>,
    /// Sluice extension: what one node may admit per window when it cannot reach a majority of
    /// its peers; `None` when absent or null (then the limit over the number of peers).
    #[serde(default)]
    pub safe_capacity: Option<u32>,
    /// Sluice extension: an IANA zone whose local days, weeks, months or years the windows
    /// follow; `None` when absent or null (then epoch windows).
    #[serde(default, deserialize_with = "lenient_opt")]
    pub time_zone: Option<String>,
    /// Sluice extension: the first day of a `unit: week` in `time_zone` (`monday` when absent).
    #[serde(default, deserialize_with = "lenient_opt")]
    pub week_start: Option<String>,
    /// Sluice extension: seconds a key stays refused after this limit refused it; `None` when
    /// absent or null (then none).
    #[serde(default)]
    pub penalty_seconds: Option<u32>,
    /// Sluice extension: requests during a penalty restart it; `None` when absent or null.
    #[serde(default, deserialize_with = "lenient_opt")]
    pub penalty_extends: Option<bool>,
}

/// One `replaces` entry.
#[derive(Debug, Default, Deserialize)]
pub struct RawReplaces {
    #[serde(default, deserialize_with = "lenient_string")]
    pub name: String,
}

/// Parses one file's text. The error is the message only; the caller prefixes the file name.
pub(crate) fn parse(text: &str) -> Result<RawRoot, String> {
    // Merge keys are resolved there, as go-yaml resolves them while decoding; without that the
    // walk below would report `unknown key '<<'` for configs the Go service accepts.
    let value = super::yaml::parse(text).map_err(|e| format!("error loading config file: {e}"))?;
    parse_value(value)
}

/// [`parse`] from a document already read into a value (a runtime limit's, built from JSON).
pub(crate) fn parse_value(value: Value) -> Result<RawRoot, String> {
    match &value {
        // An empty file (or one holding only comments) is an empty map to go-yaml; the
        // missing domain is reported later, as in Go.
        Value::Null => return Ok(RawRoot::default()),
        Value::Mapping(map) => walk_keys(map)?,
        other => {
            return Err(format!(
                "error loading config file: cannot unmarshal {} into a map",
                kind(other)
            ));
        }
    }
    serde_yaml_ng::from_value(value).map_err(|e| format!("error loading config file: {e}"))
}

/// The Go service's generic key walk (`validateYamlKeys`), in document order.
fn walk_keys(map: &Mapping) -> Result<(), String> {
    for (k, v) in map {
        let key = match k {
            Value::String(s) => s.as_str(),
            other => {
                return Err(format!(
                    "config error, key is not of type string: {}",
                    go_format(other)
                ));
            }
        };
        if !VALID_KEYS.contains(&key) {
            return Err(format!("config error, unknown key '{key}'"));
        }
        if key == METADATA_KEY {
            continue;
        }
        match v {
            Value::Sequence(items) => {
                for item in items {
                    match item {
                        Value::Mapping(m) => walk_keys(m)?,
                        other => {
                            return Err(format!(
                                "config error, yaml file contains list of type other than map: {}",
                                go_format(other)
                            ));
                        }
                    }
                }
            }
            Value::Mapping(m) => walk_keys(m)?,
            // go-yaml gives string, int, bool or nil for these; all are fine leaves.
            Value::String(_) | Value::Bool(_) | Value::Null => {}
            // Integers beyond int64 decode to uint64 in Go, which its walk rejects.
            Value::Number(n) if n.is_i64() => {}
            _ => return Err("error checking config".to_owned()),
        }
    }
    Ok(())
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a sequence",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

/// Formats a value the way Go's `%v` prints what go-yaml decoded, for error messages.
pub(crate) fn go_format(v: &Value) -> String {
    match v {
        Value::Null => "<nil>".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => {
            let s = n.to_string();
            // Go prints a float64 with no fractional part without ".0" (`%v` of 1.0 is "1").
            match s.strip_suffix(".0") {
                Some(int) if n.is_f64() => int.to_owned(),
                _ => s,
            }
        }
        Value::String(s) => s.clone(),
        Value::Sequence(items) => {
            let parts: Vec<String> = items.iter().map(go_format).collect();
            format!("[{}]", parts.join(" "))
        }
        Value::Mapping(m) => {
            let parts: Vec<String> = m
                .iter()
                .map(|(k, v)| format!("{}:{}", go_format(k), go_format(v)))
                .collect();
            format!("map[{}]", parts.join(" "))
        }
        Value::Tagged(t) => format!("{} {}", t.tag, go_format(&t.value)),
    }
}

/// A missing or null value becomes the type's default, as a zero value does in Go.
fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// go-yaml v2 decodes any scalar into a string field (`value: 200` is the string "200").
fn lenient_string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = String;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_owned())
        }
        fn visit_string<E: de::Error>(self, v: String) -> Result<String, E> {
            Ok(v)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_unit<E: de::Error>(self) -> Result<String, E> {
            Ok(String::new())
        }
        fn visit_none<E: de::Error>(self) -> Result<String, E> {
            Ok(String::new())
        }
    }
    d.deserialize_any(V)
}

/// A value read the way go-yaml v2 reads it into a Go field ([`lenient_string`],
/// [`lenient_bool`]).
trait Lenient: Sized {
    const EXPECTING: &'static str;
    fn lenient<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error>;
}

impl Lenient for String {
    const EXPECTING: &'static str = "a string";
    fn lenient<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        lenient_string(d)
    }
}

impl Lenient for bool {
    const EXPECTING: &'static str = "a bool";
    fn lenient<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        lenient_bool(d)
    }
}

/// A [`Lenient`] value for a key whose absence (or null) means something of its own: a null
/// stays `None`, so a present key can be told from an absent one.
fn lenient_opt<'de, D: Deserializer<'de>, T: Lenient>(d: D) -> Result<Option<T>, D::Error> {
    struct V<T>(std::marker::PhantomData<T>);
    impl<'de, T: Lenient> Visitor<'de> for V<T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(T::EXPECTING)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_none<E: de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<T>, D::Error> {
            T::lenient(d).map(Some)
        }
    }
    d.deserialize_option(V(std::marker::PhantomData))
}

/// go-yaml v2 follows YAML 1.1, where `yes`/`no`/`on`/`off` are booleans too.
fn lenient_bool<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = bool;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a bool")
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
            Ok(v)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
            match v {
                "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "true" | "True"
                | "TRUE" => Ok(true),
                "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" | "false" | "False"
                | "FALSE" => Ok(false),
                _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
            }
        }
        fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_none<E: de::Error>(self) -> Result<bool, E> {
            Ok(false)
        }
    }
    d.deserialize_any(V)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_yaml11_bools_are_accepted_where_go_accepts_them() {
        let root =
            parse("domain: d\ndescriptors:\n  - key: code\n    value: 200\n    shadow_mode: yes\n")
                .expect("parses");
        assert_eq!(root.descriptors[0].value, "200");
        assert!(root.descriptors[0].shadow_mode);
    }

    #[test]
    fn empty_file_is_an_empty_root() {
        let root = parse("# nothing\n").expect("parses");
        assert_eq!(root.domain, "");
        assert!(root.descriptors.is_empty());
    }

    #[test]
    fn nulls_are_zero_values() {
        let root = parse("domain: d\ndescriptors:\n  - key: k\n    value:\n    descriptors:\n")
            .expect("parses");
        assert_eq!(root.descriptors[0].value, "");
        assert!(root.descriptors[0].descriptors.is_empty());
    }

    #[test]
    fn merge_keys_are_resolved_before_the_walk() {
        let text = "domain: d\ndescriptors:\n  - &base\n    key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - <<: *base\n    key: b\n";
        let root = parse(text).expect("parses");
        assert_eq!(root.descriptors[1].key, "b");
        assert!(root.descriptors[1].rate_limit.is_some());
    }

    #[test]
    fn metadata_contents_are_not_walked() {
        let root = parse("domain: d\ndescriptors:\n  - key: k\n    metadata:\n      anything: 0.5\n      1: [x, y]\n")
            .expect("parses");
        assert!(root.descriptors[0].metadata.is_some());
    }

    #[test]
    fn typed_errors_are_load_errors() {
        let err = parse("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: -1\n      unit: second\n")
            .expect_err("negative");
        assert!(err.starts_with("error loading config file: "), "{err}");
    }

    #[test]
    fn extension_keys_parse() {
        let root = parse("domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, algorithm: token_bucket, burst: 20}\n      - {unit: day, algorithm: 1}\n")
            .expect("parses");
        let list = root.descriptors[0].rate_limits.as_ref().expect("list");
        assert_eq!(list[0].algorithm.as_deref(), Some("token_bucket"));
        assert_eq!(list[0].burst, Some(20));
        // Scalars read as strings, as for every other string field.
        assert_eq!(list[1].algorithm.as_deref(), Some("1"));
        assert_eq!(list[1].burst, None);
        let err = parse(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, burst: -1}\n",
        )
        .expect_err("negative burst");
        assert!(err.starts_with("error loading config file: "), "{err}");
    }

    #[test]
    fn go_format_matches_go_percent_v() {
        assert_eq!(go_format(&serde_yaml_ng::from_str("0.25").unwrap()), "0.25");
        assert_eq!(go_format(&serde_yaml_ng::from_str("1.0").unwrap()), "1");
        assert_eq!(
            go_format(&serde_yaml_ng::from_str("[a, 1]").unwrap()),
            "[a 1]"
        );
        assert_eq!(
            go_format(&serde_yaml_ng::from_str("{a: b}").unwrap()),
            "map[a:b]"
        );
        assert_eq!(go_format(&Value::Null), "<nil>");
    }
}
