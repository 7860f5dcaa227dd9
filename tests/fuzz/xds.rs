//! xDS `RateLimitConfig` resources -> raw config -> validated config (`xds::convert::decode`,
//! `config::build_raw`).
//!
//! envoyproxy/ratelimit loads a resource exactly as the YAML file it stands for, so the oracle
//! is that file: each resource that decodes (generated, or mutated and still decodable) is
//! written as YAML by serde_yaml_ng and loaded with `parse_files`. The two must agree: the same
//! limits and metadata, or the same errors under the same names. Resources that do not decode,
//! or have another type, are each reported by index.

use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Any, ListValue, Struct, Value};
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitReplace, RateLimitUnit,
};
use proptest::prelude::*;
use prost::Message;
use serde_yaml_ng::{Mapping, Value as Yaml};
use sluice::config::{ConfigErrors, RateLimitConfig as Config, build_raw, parse_files};
use sluice::xds::TYPE_URL;
use sluice::xds::convert::decode;

use crate::mutate::{apply, mutations, raw_bytes};
use crate::support::{fuzz_input, fuzz_parts, load_options, proptest_config, timed};

/// Protobuf syntax a mutation may insert: tags of the config's fields, a Struct's, varints.
const TOKENS: &[&[u8]] = &[
    b"\x0a\x00",
    b"\x12\x01d",
    b"\x1a\x00",
    b"\x1a\x03\x0a\x01k",
    b"\x22\x02\x08\x07",
    b"\x08\x63",
    b"\x28\x01",
    b"\x42\x00",
    b"\x42\x07\x0a\x05\x0a\x01a\x12\x00",
    b"\x11\x00\x00\x00\x00\x00\x00\xf8\x7f",
    b"\xff\xff\xff\xff\x0f",
    b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",
    b"\x0b",
    b"\x00",
];

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z]{1,2}",
        "[a-z]{0,2}\\*",
        "\\PC{0,5}",
    ]
}

fn number() -> impl Strategy<Value = f64> {
    prop_oneof![
        (-1000i32..1000).prop_map(f64::from),
        any::<f64>(),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(1e300),
        Just(0.5),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(None),
        Just(Some(Kind::NullValue(0))),
        any::<bool>().prop_map(|b| Some(Kind::BoolValue(b))),
        number().prop_map(|n| Some(Kind::NumberValue(n))),
        text().prop_map(|s| Some(Kind::StringValue(s))),
    ];
    leaf.prop_map(|kind| Value { kind })
        .prop_recursive(3, 16, 3, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..3)
                    .prop_map(|values| Some(Kind::ListValue(ListValue { values }))),
                proptest::collection::btree_map(text(), inner, 0..3).prop_map(|fields| {
                    Some(Kind::StructValue(Struct {
                        fields: fields.into_iter().collect(),
                    }))
                }),
            ]
            .prop_map(|kind| Value { kind })
        })
}

fn metadata() -> impl Strategy<Value = Struct> {
    proptest::collection::btree_map(text(), value(), 0..3).prop_map(|fields| Struct {
        fields: fields.into_iter().collect(),
    })
}

fn policy() -> impl Strategy<Value = RateLimitPolicy> {
    (
        prop_oneof![6 => 0i32..8, 1 => any::<i32>()],
        prop_oneof![0u32..10, any::<u32>(), Just(u32::MAX)],
        proptest::bool::weighted(0.2),
        text(),
        proptest::collection::vec(text(), 0..2),
    )
        .prop_map(
            |(unit, requests_per_unit, unlimited, name, replaces)| RateLimitPolicy {
                unit,
                requests_per_unit,
                unlimited,
                name,
                replaces: replaces
                    .into_iter()
                    .map(|name| RateLimitReplace { name })
                    .collect(),
            },
        )
}

fn descriptor_with(
    children: impl Strategy<Value = Vec<RateLimitDescriptor>>,
) -> impl Strategy<Value = RateLimitDescriptor> {
    (
        prop_oneof![4 => "[a-c]", 1 => text()],
        prop_oneof![Just(String::new()), "[a-c]", text()],
        proptest::option::weighted(0.7, policy()),
        children,
        any::<(bool, bool, bool)>(),
        proptest::option::weighted(0.2, metadata()),
    )
        .prop_map(|(key, value, rate_limit, descriptors, flags, metadata)| {
            RateLimitDescriptor {
                key,
                value,
                rate_limit,
                descriptors,
                shadow_mode: flags.0,
                detailed_metric: flags.1,
                quota_mode: flags.2,
                metadata,
            }
        })
}

fn resource() -> impl Strategy<Value = RateLimitConfig> {
    let descriptor = descriptor_with(Just(Vec::new())).prop_recursive(3, 16, 3, |inner| {
        descriptor_with(proptest::collection::vec(inner, 0..3))
    });
    (
        prop_oneof![Just(String::new()), "r[0-2]"],
        prop_oneof![4 => "d[0-1]", 1 => text()],
        proptest::collection::vec(descriptor, 0..4),
    )
        .prop_map(|(name, domain, descriptors)| RateLimitConfig {
            name,
            domain,
            descriptors,
        })
}

/// The oracle's YAML for a `Struct`: every number as a float, keys sorted (a Struct has no
/// order; sorted is the one Sluice documents, and it decides which bad number is reported).
fn struct_yaml(s: &Struct) -> Yaml {
    let mut fields: Vec<_> = s.fields.iter().collect();
    fields.sort_by(|a, b| a.0.cmp(b.0));
    let mut m = Mapping::new();
    for (k, v) in fields {
        m.insert(Yaml::String(k.clone()), value_yaml(v));
    }
    Yaml::Mapping(m)
}

fn value_yaml(v: &Value) -> Yaml {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Yaml::Null,
        Some(Kind::BoolValue(b)) => Yaml::Bool(*b),
        Some(Kind::NumberValue(n)) => Yaml::Number((*n).into()),
        Some(Kind::StringValue(s)) => Yaml::String(s.clone()),
        Some(Kind::ListValue(l)) => Yaml::Sequence(l.values.iter().map(value_yaml).collect()),
        Some(Kind::StructValue(s)) => struct_yaml(s),
    }
}

fn descriptor_yaml(d: &RateLimitDescriptor) -> Yaml {
    let mut m = Mapping::new();
    let mut put = |k: &str, v: Yaml| m.insert(Yaml::String(k.to_owned()), v);
    put("key", Yaml::String(d.key.clone()));
    put("value", Yaml::String(d.value.clone()));
    if let Some(p) = &d.rate_limit {
        let mut rl = Mapping::new();
        // Go's `Unit.String()`: the name, or the number for one the enum does not know.
        let unit = RateLimitUnit::try_from(p.unit)
            .map_or_else(|_| p.unit.to_string(), |u| u.as_str_name().to_owned());
        rl.insert("unit".into(), Yaml::String(unit));
        rl.insert("requests_per_unit".into(), p.requests_per_unit.into());
        rl.insert("unlimited".into(), p.unlimited.into());
        rl.insert("name".into(), Yaml::String(p.name.clone()));
        let replaces = p
            .replaces
            .iter()
            .map(|r| {
                let mut m = Mapping::new();
                m.insert("name".into(), Yaml::String(r.name.clone()));
                Yaml::Mapping(m)
            })
            .collect();
        rl.insert("replaces".into(), Yaml::Sequence(replaces));
        put("rate_limit", Yaml::Mapping(rl));
    }
    let children = d.descriptors.iter().map(descriptor_yaml).collect();
    put("descriptors", Yaml::Sequence(children));
    put("shadow_mode", d.shadow_mode.into());
    put("detailed_metric", d.detailed_metric.into());
    put("quota_mode", d.quota_mode.into());
    if let Some(s) = &d.metadata {
        put("metadata", struct_yaml(s));
    }
    Yaml::Mapping(m)
}

/// The YAML file a resource stands for.
fn file_for(cfg: &RateLimitConfig) -> String {
    let mut m = Mapping::new();
    m.insert("domain".into(), Yaml::String(cfg.domain.clone()));
    let descriptors = cfg.descriptors.iter().map(descriptor_yaml).collect();
    m.insert("descriptors".into(), Yaml::Sequence(descriptors));
    let text = serde_yaml_ng::to_string(&Yaml::Mapping(m)).expect("serialises");
    quote_merge_keys(&text)
}

/// `text` with its `<<` keys quoted. serde_yaml_ng writes a key `<<` plain, which YAML reads
/// as a merge; a metadata key `<<` is written `'<<'` in a file that means it.
fn quote_merge_keys(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let indent = line.len() - line.trim_start_matches([' ', '-']).len();
        match line[indent..].strip_prefix("<<:") {
            Some(rest) => out.push_str(&format!("{}'<<':{rest}", &line[..indent])),
            None => out.push_str(line),
        }
    }
    out
}

/// A comparable view of a config: its dump, and each limit's metadata with numbers as floats
/// (a Struct has only doubles; YAML tells integers from floats).
fn view(cfg: &Config) -> (String, Vec<(String, Option<serde_json::Value>)>) {
    fn floats(v: &serde_json::Value) -> serde_json::Value {
        use serde_json::Value as J;
        match v {
            J::Number(n) => n.as_f64().map_or(J::Null, |f| serde_json::json!(f)),
            J::Array(a) => J::Array(a.iter().map(floats).collect()),
            J::Object(o) => J::Object(o.iter().map(|(k, v)| (k.clone(), floats(v))).collect()),
            other => other.clone(),
        }
    }
    let mut limits: Vec<_> = cfg
        .limits()
        .map(|l| (l.full_key.clone(), l.metadata.as_ref().map(floats)))
        .collect();
    limits.sort_by(|a, b| a.0.cmp(&b.0));
    (cfg.dump(), limits)
}

fn errors_name(errors: &ConfigErrors, names: &[String]) {
    for e in errors.iter() {
        assert!(names.contains(&e.name), "unnamed error: {e}");
        assert!(!e.message.trim().is_empty());
    }
}

/// The check for one xDS response's resources.
pub fn check_resources(resources: &[Any], merge: bool) {
    let opts = load_options(merge);
    let decoded = decode(resources);
    // What prost makes of each resource, independently of the code under test.
    let configs: Vec<Option<RateLimitConfig>> = resources
        .iter()
        .map(|a| {
            (a.type_url == TYPE_URL)
                .then(|| RateLimitConfig::decode(a.value.as_slice()).ok())
                .flatten()
        })
        .collect();
    let names: Vec<String> = configs
        .iter()
        .enumerate()
        .map(|(i, c)| match c {
            Some(c) if !c.name.is_empty() => c.name.clone(),
            _ => format!("resource #{i}"),
        })
        .collect();
    let roots = match decoded {
        Err(errors) => {
            let bad = configs.iter().filter(|c| c.is_none()).count();
            assert_eq!(errors.len(), bad, "{errors}");
            errors_name(&errors, &names);
            return;
        }
        Ok(roots) => roots,
    };
    assert!(configs.iter().all(Option::is_some));
    let got: Vec<&String> = roots.iter().map(|(n, _)| n).collect();
    assert_eq!(got, names.iter().collect::<Vec<_>>());
    let from_xds = build_raw(roots, &opts);
    let files: Vec<(String, String)> = configs
        .iter()
        .zip(&names)
        .map(|(c, n)| (n.clone(), file_for(c.as_ref().expect("decoded"))))
        .collect();
    let from_yaml = parse_files(&files, &opts);
    match (&from_xds, &from_yaml) {
        (Ok(a), Ok(b)) => assert_eq!(view(a), view(b)),
        (Err(a), Err(b)) => {
            errors_name(a, &names);
            assert_eq!(a, b);
        }
        _ => panic!(
            "xDS and YAML disagree:\n{:?}\n{:?}\n{files:#?}",
            from_xds.as_ref().map(Config::dump),
            from_yaml.as_ref().map(Config::dump)
        ),
    }
}

/// A type URL of another resource type, which the decoder must refuse by index.
const FOREIGN_TYPE_URL: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

/// One cargo-fuzz input (`fuzz/fuzz_targets/xds.rs`): a flags byte (bit 0:
/// MERGE_DOMAIN_CONFIG; bit 1: the first resource has another type URL), then up to three
/// resources' bytes separated by NUL ([`fuzz_parts`]).
pub fn check_fuzz_input(data: &[u8]) {
    let Some((flags, rest)) = data.split_first() else {
        return;
    };
    let resources: Vec<Any> = fuzz_parts(rest, 3)
        .enumerate()
        .map(|(i, value)| Any {
            type_url: if i == 0 && flags & 2 == 2 {
                FOREIGN_TYPE_URL
            } else {
                TYPE_URL
            }
            .to_owned(),
            value: value.to_vec(),
        })
        .collect();
    check_resources(&resources, flags & 1 == 1);
}

fn any_of(cfg: &RateLimitConfig) -> Any {
    Any {
        type_url: TYPE_URL.to_owned(),
        value: cfg.encode_to_vec(),
    }
}

proptest! {
    #![proptest_config(proptest_config(384, "proptest-regressions/fuzz/xds.txt"))]

    #[test]
    fn resources_load_as_the_yaml_they_stand_for(
        configs in proptest::collection::vec(resource(), 1..4),
        merge in any::<bool>(),
    ) {
        let resources: Vec<Any> = configs.iter().map(any_of).collect();
        timed("xds generated", || check_resources(&resources, merge));
    }

    #[test]
    fn mutated_resources_load_as_their_yaml_or_are_named(
        configs in proptest::collection::vec((resource(), mutations(4), proptest::bool::weighted(0.05)), 1..4),
        merge in any::<bool>(),
    ) {
        let resources: Vec<Any> = configs
            .iter()
            .map(|(cfg, edits, foreign)| {
                let mut any = any_of(cfg);
                apply(&mut any.value, edits, TOKENS);
                if *foreign {
                    any.type_url = FOREIGN_TYPE_URL.into();
                }
                any
            })
            .collect();
        timed("xds mutated", || check_resources(&resources, merge));
    }

    /// Raw resources as the cargo-fuzz target reads them.
    #[test]
    fn raw_resources_load_or_are_named(
        values in proptest::collection::vec(raw_bytes(512), 1..3),
        merge in any::<bool>(),
    ) {
        let input = fuzz_input(u8::from(merge), &values);
        timed("xds raw", || check_fuzz_input(&input));
    }
}

/// Found by the long run: metadata with a `<<` key. The YAML twin writes it quoted (`'<<'`),
/// which go-yaml takes as a plain key and the loader once merged (and refused: a null is no
/// mapping to merge), so xDS and YAML disagreed; now the loader merges only a plain `<<`.
#[test]
fn a_quoted_merge_key_in_metadata_is_a_plain_key_as_in_go_yaml() {
    let nested = RateLimitDescriptor {
        key: "a".into(),
        metadata: Some(Struct {
            fields: [("<<".to_owned(), Value { kind: None })]
                .into_iter()
                .collect(),
        }),
        ..Default::default()
    };
    let cfg = RateLimitConfig {
        name: String::new(),
        domain: "d0".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "a".into(),
            descriptors: vec![nested],
            ..Default::default()
        }],
    };
    assert!(file_for(&cfg).contains("'<<':"), "{}", file_for(&cfg));
    check_resources(&[any_of(&cfg)], false);
}
