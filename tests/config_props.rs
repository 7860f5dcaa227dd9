//! Property tests: no input, however malformed, makes config loading or lookup panic.

use proptest::prelude::*;
use sluice::config::{LoadOptions, envoy_extensions_in, parse_files};
use sluice::descriptor::Entry;

const CONFIG: &str = r#"
domain: d
descriptors:
  - key: a
    value: x*
    share_threshold: true
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: a_x
    value: y
    rate_limit: {unlimited: true}
"#;

proptest! {
    #[test]
    fn arbitrary_text_never_panics(text in ".{0,400}") {
        let _ = parse_files(&[("f.yaml".to_owned(), text)], &LoadOptions::default());
    }

    #[test]
    fn yaml_shaped_text_never_panics(
        lines in proptest::collection::vec(
            prop_oneof![
                Just("domain: d".to_owned()),
                Just("descriptors:".to_owned()),
                Just("  - key: k".to_owned()),
                Just("    value: v*".to_owned()),
                Just("    share_threshold: true".to_owned()),
                Just("    rate_limit: {unit: second, requests_per_unit: 3}".to_owned()),
                Just("    rate_limit: {unit: second, algorithm: token_bucket, burst: 2}".to_owned()),
                Just("    rate_limits: [{unit: day, algorithm: leaky_bucket}, {unit: second}]".to_owned()),
                Just("    rate_limits: []".to_owned()),
                Just("    metadata: {a: [1, 2.5, null]}".to_owned()),
                Just("    descriptors:".to_owned()),
                Just("      - key: n".to_owned()),
                "[a-z_ :*\\-\\[\\]{}0-9.]{0,30}",
            ],
            0..20,
        )
    ) {
        let text = lines.join("\n");
        let _ = envoy_extensions_in("f.yaml", &text);
        let _ = parse_files(&[("f.yaml".to_owned(), text)], &LoadOptions::default());
    }

    #[test]
    fn arbitrary_lookups_never_panic(
        entries in proptest::collection::vec(("[a-z_*]{0,4}", "[a-z_*/]{0,6}"), 0..5)
    ) {
        let cfg = parse_files(&[("f.yaml".to_owned(), CONFIG.to_owned())], &LoadOptions::default())
            .expect("valid");
        let domain = cfg.domain("d").expect("domain");
        let entries: Vec<Entry> = entries.into_iter().map(|(k, v)| Entry::new(k, v)).collect();
        if let Some(m) = domain.lookup(&entries) {
            prop_assert!(m.shared_values.iter().all(|(i, _)| *i < entries.len()));
        }
    }
}

#[test]
fn deeply_nested_yaml_is_an_error_not_a_stack_overflow() {
    let flow = format!(
        "domain: d\ndescriptors: {}{}\n",
        "[".repeat(5000),
        "]".repeat(5000)
    );
    assert!(parse_files(&[("f.yaml".to_owned(), flow)], &LoadOptions::default()).is_err());
    let mut block = String::from("domain: d\ndescriptors:\n");
    for depth in 0..400 {
        let pad = "  ".repeat(depth * 2);
        block.push_str(&format!("{pad}- key: k\n{pad}  descriptors:\n"));
    }
    // Either outcome is fine; it must simply return.
    let _ = envoy_extensions_in("f.yaml", &block);
    let _ = parse_files(&[("f.yaml".to_owned(), block)], &LoadOptions::default());
}
