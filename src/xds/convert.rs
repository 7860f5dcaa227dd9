//! xDS `RateLimitConfig` resources -> the raw config types a YAML file parses into.
//!
//! envoyproxy/ratelimit converts each resource into its YAML structs
//! (`ConfigXdsProtoToYaml`) and loads those exactly as it loads files; so do we. After this
//! step an xDS config goes through [`crate::config::build_raw`]: the same validation, errors
//! and compiled lookup table as a file, with the resource's name where a file name would be.

use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Any, Struct, Value};
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use prost::Message;
use serde_yaml_ng::{Mapping, Value as Yaml};

use crate::config::raw::{RawDescriptor, RawRateLimit, RawReplaces, RawRoot};
use crate::config::{ConfigError, ConfigErrors};

/// The resource type Sluice subscribes to.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// Decodes every resource of one response, in order, each named by its `name` (or
/// `resource #<index>` when it has none, or cannot be decoded). Every bad resource is reported.
pub fn decode(resources: &[Any]) -> Result<Vec<(String, RawRoot)>, ConfigErrors> {
    let mut out = Vec::with_capacity(resources.len());
    let mut errors = Vec::new();
    for (i, any) in resources.iter().enumerate() {
        let fallback = || format!("resource #{i}");
        if any.type_url != TYPE_URL {
            errors.push(ConfigError::new(
                fallback(),
                format!("unexpected resource type '{}'", any.type_url),
            ));
            continue;
        }
        match RateLimitConfig::decode(any.value.as_slice()) {
            Ok(cfg) => {
                let name = if cfg.name.is_empty() {
                    fallback()
                } else {
                    cfg.name.clone()
                };
                out.push((name, to_raw(cfg)));
            }
            Err(e) => errors.push(ConfigError::new(
                fallback(),
                format!("cannot decode RateLimitConfig: {e}"),
            )),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(ConfigErrors(errors))
    }
}

/// One resource as the YAML file it stands for.
pub(crate) fn to_raw(cfg: RateLimitConfig) -> RawRoot {
    RawRoot {
        domain: cfg.domain,
        descriptors: cfg.descriptors.into_iter().map(descriptor).collect(),
    }
}

fn descriptor(d: RateLimitDescriptor) -> RawDescriptor {
    RawDescriptor {
        key: d.key,
        value: d.value,
        // The resource has no field for a pattern.
        value_regex: None,
        rate_limit: d.rate_limit.map(policy),
        // The resource has no field for Sluice's extensions nor for share_threshold and
        // value_to_metric: they keep their defaults, as in the Go service.
        rate_limits: None,
        descriptors: d.descriptors.into_iter().map(descriptor).collect(),
        shadow_mode: d.shadow_mode,
        quota_mode: d.quota_mode,
        detailed_metric: d.detailed_metric,
        value_to_metric: false,
        share_threshold: false,
        metadata: d.metadata.map(|s| struct_to_yaml(&s)),
    }
}

fn policy(p: RateLimitPolicy) -> RawRateLimit {
    RawRateLimit {
        safe_capacity: None,
        requests_per_unit: p.requests_per_unit,
        unit: unit_name(p.unit),
        unlimited: p.unlimited,
        name: p.name,
        replaces: p
            .replaces
            .into_iter()
            .map(|r| RawReplaces { name: r.name })
            .collect(),
        algorithm: None,
        burst: None,
        charge_refused: None,
        unit_multiplier: None,
        time_zone: None,
        week_start: None,
        // RateLimitPolicy has no place for a penalty: YAML only.
        penalty_seconds: None,
        penalty_extends: None,
    }
}

/// The unit as Go's `Unit.String()` writes it: `UNKNOWN` for 0 (so an unlimited policy passes
/// and a limited one fails with `invalid rate limit unit 'UNKNOWN'`), the number for a value
/// the enum does not know.
fn unit_name(unit: i32) -> String {
    RateLimitUnit::try_from(unit)
        .map(|u| u.as_str_name().to_owned())
        .unwrap_or_else(|_| unit.to_string())
}

/// A Struct as the YAML map it would have been written as. Keys are sorted: a Struct has no
/// order, and the YAML path keeps document order, so sorted is the stable choice.
fn struct_to_yaml(s: &Struct) -> Yaml {
    let mut keys: Vec<&String> = s.fields.keys().collect();
    keys.sort();
    let mut map = Mapping::with_capacity(keys.len());
    for k in keys {
        map.insert(Yaml::String(k.clone()), value_to_yaml(&s.fields[k]));
    }
    Yaml::Mapping(map)
}

fn value_to_yaml(v: &Value) -> Yaml {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Yaml::Null,
        Some(Kind::BoolValue(b)) => Yaml::Bool(*b),
        Some(Kind::StringValue(s)) => Yaml::String(s.clone()),
        // A Struct only has doubles; a whole number is written as an integer, as YAML would.
        Some(Kind::NumberValue(n)) => {
            if n.fract() == 0.0 && n.abs() < 9.0e15 {
                Yaml::Number((*n as i64).into())
            } else {
                Yaml::Number((*n).into())
            }
        }
        Some(Kind::StructValue(s)) => struct_to_yaml(s),
        Some(Kind::ListValue(l)) => Yaml::Sequence(l.values.iter().map(value_to_yaml).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LoadOptions, build_raw, parse_files};
    use envoy_types::pb::google::protobuf::ListValue;
    use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitReplace;

    fn any(cfg: &RateLimitConfig) -> Any {
        Any {
            type_url: TYPE_URL.to_owned(),
            value: cfg.encode_to_vec(),
        }
    }

    fn policy(unit: RateLimitUnit, n: u32) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit: n,
            ..Default::default()
        })
    }

    fn desc(key: &str, value: &str, rl: Option<RateLimitPolicy>) -> RateLimitDescriptor {
        RateLimitDescriptor {
            key: key.to_owned(),
            value: value.to_owned(),
            rate_limit: rl,
            ..Default::default()
        }
    }

    #[test]
    fn a_resource_compiles_like_the_same_yaml() {
        let mut nested = desc("a", "1", None);
        nested.descriptors = vec![desc("b", "", policy(RateLimitUnit::Hour, 3))];
        let mut shadow = desc("s", "x*", policy(RateLimitUnit::Week, 9));
        shadow.shadow_mode = true;
        shadow.quota_mode = true;
        let mut free = desc("free", "", None);
        free.rate_limit = Some(RateLimitPolicy {
            unlimited: true,
            name: "free".into(),
            replaces: vec![RateLimitReplace {
                name: "paid".into(),
            }],
            ..Default::default()
        });
        let cfg = RateLimitConfig {
            name: "edge-config".into(),
            domain: "edge".into(),
            descriptors: vec![
                nested,
                shadow,
                free,
                desc("k", "", policy(RateLimitUnit::Second, 5)),
            ],
        };
        let roots = decode(&[any(&cfg)]).expect("decodes");
        assert_eq!(roots[0].0, "edge-config");
        let from_xds = build_raw(roots, &LoadOptions::default()).expect("valid");
        let yaml = r#"
domain: edge
descriptors:
  - key: a
    value: "1"
    descriptors:
      - key: b
        rate_limit: {unit: hour, requests_per_unit: 3}
  - key: s
    value: x*
    shadow_mode: true
    quota_mode: true
    rate_limit: {unit: week, requests_per_unit: 9}
  - key: free
    rate_limit: {unlimited: true, name: free, replaces: [{name: paid}]}
  - key: k
    rate_limit: {unit: second, requests_per_unit: 5}
"#;
        let from_file = parse_files(
            &[("edge.yaml".into(), yaml.into())],
            &LoadOptions::default(),
        )
        .expect("valid");
        assert_eq!(from_xds.dump(), from_file.dump());
        assert!(!from_xds.dump().is_empty());
    }

    #[test]
    fn errors_are_the_file_errors_named_by_resource() {
        let bad_unit = RateLimitConfig {
            name: "r1".into(),
            domain: "d".into(),
            descriptors: vec![desc("k", "", policy(RateLimitUnit::Unknown, 1))],
        };
        let no_domain = RateLimitConfig {
            name: String::new(),
            domain: String::new(),
            descriptors: vec![],
        };
        let dup = RateLimitConfig {
            name: "r3".into(),
            domain: "d".into(),
            descriptors: vec![],
        };
        let roots = decode(&[any(&bad_unit), any(&no_domain), any(&dup)]).expect("decodes");
        let err = build_raw(roots, &LoadOptions::default()).expect_err("invalid");
        assert_eq!(
            err.to_string(),
            "r1: invalid rate limit unit 'UNKNOWN'\n\
             resource #1: config file cannot have empty domain"
        );
        // r1 failed, so r3's domain is not a duplicate; with r1 fixed it is.
        let ok = RateLimitConfig {
            descriptors: vec![],
            ..bad_unit
        };
        let err = build_raw(
            decode(&[any(&ok), any(&dup)]).unwrap(),
            &LoadOptions::default(),
        )
        .expect_err("duplicate");
        assert_eq!(err.to_string(), "r3: duplicate domain 'd' in config file");
        let merged = build_raw(
            decode(&[any(&ok), any(&dup)]).unwrap(),
            &LoadOptions {
                merge_domain_config: true,
                ..LoadOptions::default()
            },
        );
        assert!(merged.is_ok());
    }

    #[test]
    fn undecodable_and_foreign_resources_are_named_by_index() {
        let foreign = Any {
            type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
            value: vec![],
        };
        let garbage = Any {
            type_url: TYPE_URL.into(),
            value: vec![0x0a, 0xff],
        };
        let err = decode(&[foreign, garbage]).expect_err("bad");
        assert_eq!(err.len(), 2);
        assert_eq!(
            err.0[0].to_string(),
            "resource #0: unexpected resource type 'type.googleapis.com/envoy.config.cluster.v3.Cluster'"
        );
        assert!(
            err.0[1]
                .to_string()
                .starts_with("resource #1: cannot decode RateLimitConfig:"),
            "{err}"
        );
    }

    #[test]
    fn unknown_unit_numbers_and_unlimited_unknown() {
        assert_eq!(unit_name(99), "99");
        assert_eq!(unit_name(7), "WEEK");
        let mut free = desc("k", "", None);
        free.rate_limit = Some(RateLimitPolicy {
            unlimited: true,
            ..Default::default()
        });
        let cfg = RateLimitConfig {
            name: "n".into(),
            domain: "d".into(),
            descriptors: vec![free],
        };
        build_raw(decode(&[any(&cfg)]).unwrap(), &LoadOptions::default()).expect("valid");
    }

    #[test]
    fn metadata_becomes_the_same_json_as_yaml_metadata() {
        let s = |fields: Vec<(&str, Kind)>| Struct {
            fields: fields
                .into_iter()
                .map(|(k, v)| (k.to_owned(), Value { kind: Some(v) }))
                .collect(),
        };
        let meta = s(vec![
            ("tier", Kind::StringValue("gold".into())),
            ("n", Kind::NumberValue(1.0)),
            ("ratio", Kind::NumberValue(0.5)),
            ("on", Kind::BoolValue(true)),
            (
                "nested",
                Kind::StructValue(s(vec![("x", Kind::NullValue(0))])),
            ),
            (
                "list",
                Kind::ListValue(ListValue {
                    values: vec![Value {
                        kind: Some(Kind::StringValue("a".into())),
                    }],
                }),
            ),
        ]);
        let mut d = desc("k", "", policy(RateLimitUnit::Minute, 1));
        d.metadata = Some(meta);
        let cfg = RateLimitConfig {
            name: "n".into(),
            domain: "d".into(),
            descriptors: vec![d],
        };
        let compiled =
            build_raw(decode(&[any(&cfg)]).unwrap(), &LoadOptions::default()).expect("valid");
        let limit = compiled.limits().next().expect("one limit");
        assert_eq!(
            limit.metadata,
            Some(serde_json::json!({
                "tier": "gold", "n": 1, "ratio": 0.5, "on": true,
                "nested": {"x": null}, "list": ["a"]
            }))
        );
    }
}
