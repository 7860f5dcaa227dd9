//! The runtime-limit measurements' domain (issue 38): `d`, with per-tenant limits
//! `tenant=t<i>` written in the YAML or set at run time. For `benches/decision.rs`'s
//! `runtime_limits`, `runtime_profile` and `runtime_memory`.

use std::sync::Arc;

use sluice::config::{ConfigHandle, LoadOptions, RateLimitConfig, parse_files};

/// Tenants in the scale requirement.
pub const TENANTS: usize = 100_000;

/// The three configs of [`configs`], in its order.
pub const CONFIGS: [&str; 3] = ["yaml_100k", "runtime_100k", "yaml_100k_runtime_miss"];

/// Domain `d`: one unrelated limit (`other`, so the domain exists with no tenant), then
/// `tenant=t<i>` for each of `tenants`, `per_minute` a minute each. Built as YAML text and
/// parsed, as a config file is.
pub fn yaml(tenants: usize, per_minute: u32) -> RateLimitConfig {
    let mut text = String::with_capacity(tenants * 90 + 200);
    text.push_str(
        "domain: d\ndescriptors:\n  - key: other\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
    );
    for i in 0..tenants {
        text.push_str(&format!(
            "  - key: tenant\n    value: t{i}\n    rate_limit: {{unit: minute, requests_per_unit: {per_minute}}}\n"
        ));
    }
    parse_files(&[("d.yaml".into(), text)], &LoadOptions::default()).expect("the config loads")
}

/// A runtime limit's body: `per_minute` a minute.
pub fn body(per_minute: u32) -> serde_json::Value {
    serde_json::json!({"unit": "minute", "requests_per_unit": per_minute})
}

/// The stamp of every change here: a fixed time, and the origin of a node outside a cluster.
pub fn made(origin: &Arc<str>) -> (u64, &Arc<str>) {
    (1_764_000_000_000_000, origin)
}

/// Sets `key=<prefix><i>` at run time in domain `d` for each of `count`, `per_minute` a minute
/// each, in one change (as loading SLUICE_RUNTIME_LIMITS_PATH does; one change per limit, as
/// the API makes them, leaves the same tree).
pub fn set_runtime(config: &ConfigHandle, key: &str, prefix: &str, count: usize, per_minute: u32) {
    let origin: Arc<str> = "".into();
    let body = body(per_minute);
    config.change(|s| {
        for i in 0..count {
            let value = format!("{prefix}{i}");
            s.put("d", &[(key, Some(&value))], body.clone(), made(&origin))
                .expect("a valid runtime limit");
        }
    });
}

/// The [`TENANTS`] tenant limits three ways ([`CONFIGS`]): in the YAML; set at run time over
/// the YAML of the one unrelated limit; in the YAML with as many runtime limits on another key
/// (`user=u<i>`) beside them, so each level also probes a runtime tree that has nothing there.
pub fn configs(per_minute: u32) -> [ConfigHandle; 3] {
    let runtime = ConfigHandle::new(Some(yaml(0, per_minute)));
    set_runtime(&runtime, "tenant", "t", TENANTS, per_minute);
    let miss = ConfigHandle::new(Some(yaml(TENANTS, per_minute)));
    set_runtime(&miss, "user", "u", TENANTS, per_minute);
    [
        ConfigHandle::new(Some(yaml(TENANTS, per_minute))),
        runtime,
        miss,
    ]
}

/// Every tenant's value, `t<i>`, in a fixed shuffled order (an LCG's), the same each run.
pub fn shuffled() -> Vec<String> {
    let mut order: Vec<usize> = (0..TENANTS).collect();
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    for i in (1..order.len()).rev() {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        order.swap(i, (x >> 33) as usize % (i + 1));
    }
    order.iter().map(|i| format!("t{i}")).collect()
}
