//! Runtime limits: checked as the YAML, matched as if written into it at their paths.

use super::*;
use crate::config::runtime::{Applied, Replicated, RuntimeState, Stamp};
use crate::config::{ConfigHandle, Source};
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

const YAML: &str = "domain: d
descriptors:
  - key: tenant
    value: acme
    rate_limit: {unit: minute, requests_per_unit: 10}
    descriptors:
      - key: path
        value: /x
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: tenant
    value: ab*
    rate_limit: {unit: hour, requests_per_unit: 7}
  - key: region
    rate_limit: {unit: hour, requests_per_unit: 3}
";

fn yaml() -> RateLimitConfig {
    let mut b = Builder::new(&crate::config::LoadOptions::default());
    b.add_file(raw::parse(YAML).unwrap()).unwrap();
    b.finish()
}

fn per_minute(n: u32) -> serde_json::Value {
    json!({"unit": "minute", "requests_per_unit": n})
}

/// The matched limit's full key, requests per unit and source.
fn matched(h: &ConfigHandle, entries: &[(&str, &str)]) -> Option<(String, u32, Source)> {
    let cfg = h.current()?;
    let entries: Vec<Entry> = entries.iter().map(|(k, v)| Entry::new(*k, *v)).collect();
    let m = cfg.domain("d")?.lookup(&entries)?;
    let rpu = m.limit.slowest_block().map_or(0, |q| q.requests_per_unit);
    Some((m.limit.full_key.clone(), rpu, m.limit.source))
}

fn put(
    h: &ConfigHandle,
    levels: &[PathLevel<'_>],
    body: serde_json::Value,
) -> Result<Change, PutError> {
    h.change(|s| s.put("d", levels, body, (1, &"n".into())))
        .map(|(c, _)| c)
}

#[test]
fn a_runtime_limit_takes_precedence_at_its_path_and_adds_paths_the_yaml_lacks() {
    let h = ConfigHandle::new(Some(yaml()));
    let acme = ("tenant", Some("acme"));
    assert!(matches!(
        put(&h, &[acme], per_minute(2)),
        Ok(Change::Created)
    ));
    assert_eq!(
        matched(&h, &[("tenant", "acme")]),
        Some(("d.tenant_acme".to_owned(), 2, Source::Runtime))
    );
    // The YAML's children stay below the runtime node: the trees are merged.
    assert_eq!(
        matched(&h, &[("tenant", "acme"), ("path", "/x")]),
        Some(("d.tenant_acme.path_/x".to_owned(), 5, Source::Config))
    );
    // A new path, below a YAML node.
    let y = [acme, ("path", Some("/y"))];
    assert!(matches!(put(&h, &y, per_minute(1)), Ok(Change::Created)));
    assert_eq!(
        matched(&h, &[("tenant", "acme"), ("path", "/y")]),
        Some(("d.tenant_acme.path_/y".to_owned(), 1, Source::Runtime))
    );
    // An exact runtime node beats the YAML's wildcard; other values still match the wildcard.
    assert!(put(&h, &[("tenant", Some("abc"))], per_minute(9)).is_ok());
    assert_eq!(matched(&h, &[("tenant", "abc")]).map(|m| m.1), Some(9));
    assert_eq!(matched(&h, &[("tenant", "abd")]).map(|m| m.1), Some(7));
    // A key-only runtime node replaces the YAML's key-only limit.
    assert!(matches!(
        put(&h, &[("region", None)], per_minute(4)),
        Ok(Change::Created)
    ));
    assert_eq!(matched(&h, &[("region", "eu")]).map(|m| m.1), Some(4));
    let dump = h.current().unwrap().dump();
    assert!(
        dump.contains("d.region: unit=MINUTE requests_per_unit=4, shadow_mode: false, quota_mode: false, source: runtime\n"),
        "{dump}"
    );
    assert!(
        dump.contains("d.tenant_acme.path_/x: unit=MINUTE requests_per_unit=5, shadow_mode: false, quota_mode: false\n"),
        "{dump}"
    );
    // The YAML's limit at a runtime limit's path is not in force, and not listed.
    assert!(
        dump.contains("d.tenant_acme: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false, source: runtime\n")
            && !dump.contains("d.tenant_acme: unit=MINUTE requests_per_unit=10,"),
        "{dump}"
    );
    // Counted as listed: the replaced YAML limits (`tenant=acme`, `region`) left out.
    let cfg = h.current().unwrap();
    let yaml_limits = yaml().limit_count();
    assert_eq!(cfg.limit_count(), yaml_limits - 2 + 4);
    assert_eq!(cfg.limit_count(), cfg.limits().count());
    assert_eq!(cfg.limit_count(), dump.lines().count());
}

#[test]
fn removing_a_runtime_limit_brings_the_yaml_back_and_leaves_no_node_behind() {
    let h = ConfigHandle::new(Some(yaml()));
    let deep = [
        ("tenant", Some("new")),
        ("path", Some("/a")),
        ("m", Some("GET")),
    ];
    put(&h, &deep, per_minute(1)).unwrap();
    put(&h, &[("tenant", Some("acme"))], per_minute(2)).unwrap();
    assert_eq!(
        matched(&h, &[("tenant", "new"), ("path", "/a"), ("m", "GET")]).map(|m| m.1),
        Some(1)
    );
    // The levels above a runtime limit have no limit of their own.
    assert_eq!(matched(&h, &[("tenant", "new")]), None);
    let (removed, _) = h
        .change(|s| s.remove("d", &deep, (2, &"n".into())))
        .unwrap();
    assert_eq!(removed.body, per_minute(1));
    assert!(
        h.change(|s| s.remove("d", &deep, (2, &"n".into())))
            .is_none()
    );
    assert_eq!(
        matched(&h, &[("tenant", "new"), ("path", "/a"), ("m", "GET")]),
        None
    );
    h.change(|s| s.remove("d", &[("tenant", Some("acme"))], (2, &"n".into())))
        .unwrap();
    assert_eq!(
        matched(&h, &[("tenant", "acme")]).map(|m| m.2),
        Some(Source::Config)
    );
    let cfg = h.current().unwrap();
    assert!(
        cfg.domain("d").unwrap().runtime.is_none(),
        "an empty layer is dropped"
    );
    assert_eq!(h.runtime(RuntimeState::len), 0);
}

#[test]
fn a_reload_keeps_the_runtime_limits_and_a_runtime_domain_needs_no_yaml() {
    let h = ConfigHandle::new(None);
    assert!(h.current().is_none());
    put(&h, &[("tenant", Some("acme"))], per_minute(2)).unwrap();
    assert_eq!(matched(&h, &[("tenant", "acme")]).map(|m| m.1), Some(2));
    h.store(yaml());
    assert_eq!(matched(&h, &[("tenant", "acme")]).map(|m| m.1), Some(2));
    assert_eq!(matched(&h, &[("region", "x")]).map(|m| m.1), Some(3));
    h.store(RateLimitConfig::empty());
    assert_eq!(matched(&h, &[("tenant", "acme")]).map(|m| m.1), Some(2));
}

#[test]
fn the_runtime_rules_refuse_wildcards_a_key_only_level_beside_one_and_past_the_cap() {
    let h = ConfigHandle::with_max_runtime_limits(Some(yaml()), 2);
    assert_eq!(
        put(&h, &[("tenant", Some("a*"))], per_minute(1)).unwrap_err(),
        PutError::Invalid(
            "tenant=a*: a runtime limit's value cannot contain '*' (wildcards come from the YAML; set the limit per value)".to_owned()
        )
    );
    assert_eq!(
        put(&h, &[("tenant", None)], per_minute(1)).unwrap_err(),
        PutError::Invalid(
            "tenant: a key-only runtime level where the YAML has the wildcard 'tenant_ab*' on the same key would apply only to the values the wildcard does not match; set the limit per value instead".to_owned()
        )
    );
    // Below an exact node the wildcard's level is not this one.
    assert!(
        put(
            &h,
            &[("tenant", Some("acme")), ("tenant", None)],
            per_minute(1)
        )
        .is_ok()
    );
    assert!(put(&h, &[("tenant", Some("b"))], per_minute(1)).is_ok());
    assert_eq!(
        put(&h, &[("tenant", Some("c"))], per_minute(1)).unwrap_err(),
        PutError::Full { max: 2 }
    );
    // A change to an existing path still applies when full.
    assert!(matches!(
        put(&h, &[("tenant", Some("b"))], per_minute(5)),
        Ok(Change::Replaced { .. })
    ));
    assert_eq!(
        put(&h, &[("tenant", Some("c"))], json!({"unit": "fortnight"})).unwrap_err(),
        PutError::Invalid("invalid rate limit unit 'fortnight'".to_owned())
    );
}

#[test]
fn a_preview_shows_the_change_and_makes_none() {
    let h = ConfigHandle::new(Some(yaml()));
    let acme = [("tenant", Some("acme"))];
    let (change, limit, cfg) = h
        .runtime(|s| s.preview_put("d", &acme, per_minute(2)))
        .unwrap();
    assert!(matches!(change, Change::Created));
    assert_eq!(limit.limit.full_key, "d.tenant_acme");
    let m = cfg
        .domain("d")
        .unwrap()
        .lookup(&[Entry::new("tenant", "acme")])
        .unwrap();
    assert_eq!(m.limit.source, Source::Runtime);
    assert_eq!(
        matched(&h, &[("tenant", "acme")]).map(|m| m.2),
        Some(Source::Config)
    );
    assert!(h.runtime(|s| s.preview_remove("d", &acme)).is_none());
    put(&h, &acme, per_minute(2)).unwrap();
    let (old, cfg) = h.runtime(|s| s.preview_remove("d", &acme)).unwrap();
    assert_eq!(old.body, per_minute(2));
    let m = cfg
        .domain("d")
        .unwrap()
        .lookup(&[Entry::new("tenant", "acme")])
        .unwrap();
    assert_eq!(m.limit.source, Source::Config);
    assert_eq!(
        matched(&h, &[("tenant", "acme")]).map(|m| m.2),
        Some(Source::Runtime)
    );
}

#[test]
fn explain_walks_the_runtime_nodes_and_many_limits_each_find_their_own() {
    let h = ConfigHandle::new(Some(yaml()));
    for i in 0..2_000 {
        let v = format!("t{i}");
        put(
            &h,
            &[("tenant", Some(&v)), ("path", None)],
            per_minute(i + 1),
        )
        .unwrap();
    }
    assert_eq!(h.runtime(RuntimeState::len), 2_000);
    for i in [0, 999, 1_999] {
        let v = format!("t{i}");
        assert_eq!(
            matched(&h, &[("tenant", &v), ("path", "/any")]).map(|m| m.1),
            Some(i + 1)
        );
    }
    let cfg = h.current().unwrap();
    let d = cfg.domain("d").unwrap();
    let (steps, m) = d.explain(&[Entry::new("tenant", "t5"), Entry::new("path", "/p")]);
    assert_eq!(m.unwrap().limit.full_key, "d.tenant_t5.path");
    let first = steps[0].matched.as_ref().unwrap();
    assert_eq!(
        (first.node, first.how, first.has_children),
        ("tenant_t5", "exact", true)
    );
    let second = steps[1].matched.as_ref().unwrap();
    assert_eq!((second.node, second.how), ("path", "key only"));
    assert_eq!(second.limit.unwrap().source, Source::Runtime);
    assert_eq!(d.runtime_limits().count(), 2_000);
    let got = d
        .runtime_limit(&[("tenant", Some("t7")), ("path", None)])
        .unwrap();
    assert_eq!(got.body, per_minute(8));
}

#[test]
fn the_bodys_descriptor_fields_go_to_the_descriptor_and_the_rest_to_its_rate_limit() {
    let body = json!({
        "unit": "minute", "requests_per_unit": 2, "name": "n",
        "shadow_mode": true, "detailed_metric": true, "metadata": {"team": "a"},
    });
    let limit = compile("d", &[("k", Some("v"))], body, Stamp::default())
        .unwrap()
        .limit;
    assert!(limit.shadow_mode && limit.detailed_metric);
    assert_eq!(limit.name, "n");
    assert_eq!(limit.metadata, Some(json!({"team": "a"})));
    let several = json!({"rate_limits": [
        {"unit": "second", "requests_per_unit": 5},
        {"unit": "hour", "requests_per_unit": 100, "name": "hourly"},
    ]});
    let limit = compile("d", &[("k", None)], several, Stamp::default())
        .unwrap()
        .limit;
    assert_eq!(limit.slowest_block().unwrap().requests_per_unit, 100);
    assert_eq!(
        compile("d", &[("k", None)], json!({}), Stamp::default()).unwrap_err(),
        "the body sets no rate limit"
    );
    assert_eq!(
        compile(
            "d",
            &[("k", None)],
            json!({"unit": "minute", "colour": "red"}),
            Stamp::default()
        )
        .unwrap_err(),
        "config error, unknown key 'colour'"
    );
}

fn change(path: &str, body: Option<serde_json::Value>, at_us: u64, origin: &str) -> Replicated {
    Replicated {
        domain: "d".to_owned(),
        levels: vec![("tenant".to_owned(), Some(path.to_owned()))],
        body,
        at_us,
        origin: origin.to_owned(),
    }
}

#[test]
fn the_later_change_wins_in_any_order_and_a_removal_is_not_undone_by_an_older_put() {
    let mut a = RuntimeState::default();
    let put5 = change("x", Some(per_minute(5)), 5, "n1");
    let put9 = change("x", Some(per_minute(9)), 9, "n2");
    let del7 = change("x", None, 7, "n3");
    assert_eq!(a.apply(&put9), Applied::Set);
    assert_eq!(a.apply(&put5), Applied::Stale);
    assert_eq!(a.apply(&del7), Applied::Stale);
    let mut b = RuntimeState::default();
    assert_eq!(b.apply(&del7), Applied::Removed);
    assert_eq!(b.apply(&put5), Applied::Stale, "the removal is remembered");
    assert_eq!(b.apply(&put9), Applied::Set);
    assert_eq!(a.export(), b.export());
    // Ties go to the greater address; the same change twice is stale.
    let tie = change("x", Some(per_minute(1)), 9, "n3");
    assert_eq!(a.apply(&tie), Applied::Set);
    assert_eq!(a.apply(&tie), Applied::Stale);
    // A change made here after one from a node whose clock runs ahead still wins.
    let (_, limit) = a
        .put(
            "d",
            &[("tenant", Some("x"))],
            per_minute(2),
            (3, &"n0".into()),
        )
        .unwrap();
    assert_eq!(limit.stamp.at_us, 10);
    let (_, removed) = a
        .remove("d", &[("tenant", Some("x"))], (4, &"n0".into()))
        .unwrap();
    assert_eq!(removed.at_us, 11);
    // A node that catches up takes the export, removals included.
    let mut c = RuntimeState::default();
    c.apply(&change("x", Some(per_minute(1)), 1, "n9"));
    for (_, r) in a.export() {
        c.apply(&r);
    }
    assert_eq!(c.export(), a.export());
    assert!(c.is_empty());
    assert_eq!(
        a.apply(&change("y", Some(json!({"unit": "fortnight"})), 1, "n9")),
        Applied::Refused("invalid rate limit unit 'fortnight'".to_owned())
    );
}

#[test]
fn a_path_naming_another_paths_node_is_refused_and_never_reads_or_removes_it() {
    // `tenant=a_b` and the key-only `tenant_a_b` are both the node `tenant_a_b`.
    let h = ConfigHandle::new(Some(yaml()));
    let set = [("tenant", Some("a_b"))];
    let twin = [("tenant_a_b", None)];
    put(&h, &set, per_minute(2)).unwrap();
    assert_eq!(
        put(&h, &twin, per_minute(9)).unwrap_err(),
        PutError::Invalid(
            "duplicate descriptor composite key 'd.tenant_a_b' (the runtime limit at tenant=a_b has it)"
                .to_owned()
        )
    );
    assert!(
        h.runtime(|s| s.preview_put("d", &twin, per_minute(9)))
            .is_err()
    );
    let cfg = h.current().unwrap();
    let d = cfg.domain("d").unwrap();
    assert!(d.runtime_limit(&twin).is_none());
    assert_eq!(d.runtime_limit(&set).unwrap().body, per_minute(2));
    assert!(h.runtime(|s| s.preview_remove("d", &twin)).is_none());
    assert!(
        h.change(|s| s.remove("d", &twin, (2, &"n".into())))
            .is_none()
    );
    assert_eq!(matched(&h, &[("tenant", "a_b")]).map(|m| m.1), Some(2));
    // A change of the limit at its own path is still a change.
    assert!(matches!(
        put(&h, &set, per_minute(3)),
        Ok(Change::Replaced { .. })
    ));
}

/// The digest recomputed from scratch over what the state exports.
fn digest_of(s: &RuntimeState) -> super::Digest {
    let mut d = super::Digest::default();
    for (_, r) in s.export() {
        let levels = r.levels.iter().map(|(k, v)| (k.as_str(), v.as_deref()));
        d.add(super::digest::entry_hash(
            &r.domain,
            levels,
            &r.stamp(),
            r.body.is_none(),
        ));
    }
    d
}

/// One change of the property below: a path (of three, one below another), a limit or a
/// removal, a time and an origin. (Not two paths naming one node, `tenant=a_b` and
/// `tenant_a_b`: the API refuses the second, but two nodes may each take one at once, and then
/// which holds the node depends on the order they arrive in.)
fn arbitrary_change() -> impl proptest::strategy::Strategy<Value = Replicated> {
    use proptest::prelude::*;
    (
        0..3usize,
        proptest::option::of(1u32..4),
        1u64..40,
        0..3usize,
    )
        .prop_map(|(path, rpu, at_us, origin)| {
            let levels = match path {
                0 => vec![("tenant".to_owned(), Some("a".to_owned()))],
                1 => vec![("tenant".to_owned(), Some("b".to_owned()))],
                _ => vec![
                    ("tenant".to_owned(), Some("a".to_owned())),
                    ("path".to_owned(), None),
                ],
            };
            Replicated {
                domain: "d".to_owned(),
                levels,
                body: rpu.map(per_minute),
                at_us,
                origin: format!("n{origin}"),
            }
        })
}

proptest::proptest! {
    /// Whatever changes two nodes see, in whatever order, the digest kept as they came is the
    /// one computed over what each holds; nodes holding the same have the same digest, and
    /// nodes holding different entries different ones.
    #[test]
    fn the_digest_is_kept_exact_and_is_equal_exactly_when_the_entries_are(
        changes in proptest::collection::vec(arbitrary_change(), 1..24),
        order in proptest::collection::vec(0..1000usize, 24),
        skip in 0..24usize,
    ) {
        // Every change has a stamp of its own, as the nodes' do.
        let changes: Vec<Replicated> = changes
            .into_iter()
            .enumerate()
            .map(|(i, c)| Replicated { at_us: c.at_us * 64 + i as u64, ..c })
            .collect();
        let mut a = RuntimeState::default();
        for c in &changes {
            a.apply(c);
        }
        proptest::prop_assert_eq!(a.digest(), digest_of(&a));
        let mut shuffled: Vec<(usize, &Replicated)> =
            changes.iter().enumerate().map(|(i, c)| (order[i], c)).collect();
        shuffled.sort_by_key(|(k, _)| *k);
        let mut b = RuntimeState::default();
        for (_, c) in &shuffled {
            b.apply(c);
        }
        proptest::prop_assert_eq!(b.digest(), digest_of(&b));
        proptest::prop_assert_eq!(a.export(), b.export());
        proptest::prop_assert_eq!(a.digest(), b.digest());
        // A node that missed one change holds the same only if that change lost anyway.
        let mut c = RuntimeState::default();
        for (i, change) in changes.iter().enumerate() {
            if i != skip {
                c.apply(change);
            }
        }
        proptest::prop_assert_eq!(c.digest(), digest_of(&c));
        proptest::prop_assert_eq!(c.export() == a.export(), c.digest() == a.digest());
    }
}

#[test]
fn the_digest_follows_the_apis_changes_and_forgets_pruned_removals() {
    let mut s = RuntimeState::default();
    let origin: std::sync::Arc<str> = "n0".into();
    s.put("d", &[("tenant", Some("x"))], per_minute(2), (1, &origin))
        .unwrap();
    s.put("d", &[("tenant", Some("x"))], per_minute(3), (2, &origin))
        .unwrap();
    assert_eq!(s.digest().entries, 1);
    s.remove("d", &[("tenant", Some("x"))], (3, &origin))
        .unwrap();
    assert_eq!(s.digest(), digest_of(&s));
    assert_eq!(s.digest().entries, 1, "the removal is remembered");
    // Removals older than a day are forgotten when the table is pruned, and leave the digest.
    // (The table is pruned when it passes 1,024 removals.)
    for i in 0..1023u64 {
        s.apply(&change(&format!("old{i}"), None, 10 + i, "n1"));
    }
    assert_eq!(s.digest().entries, 1024);
    s.apply(&change("new", None, TOMBSTONE_LIFE_US + 5_000, "n1"));
    assert_eq!(s.digest().entries, 1, "only the new removal is left");
    assert_eq!(s.digest(), digest_of(&s));
}
