//! The configured limit beside each per-limit series, so a dashboard can divide the hits by it:
//! requests_per_unit, the window's length in seconds, its unit and `unit_multiplier`, one value
//! per label set of the per-limit counters (same labels, same SLUICE_MAX_STAT_KEYS cap: only
//! keys that have stats get one).
//!
//! The values are looked up when the exporters read them, in the config loaded at that moment
//! ([`LimitTable`]), by the configured limit each stats key counts against: a limit a reload
//! changes reports its new value at the next scrape, and one it removes reports none. A
//! per-request override reports the last override a request carried.
//!
//! A limit with several blocks (`rate_limits`) reports its slowest block: the lowest
//! requests_per_unit over window, which is the one that binds hits that come steadily (the
//! highest of the blocks' utilisations at a steady rate).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use super::stats::{Entry, Source, Stats};
use crate::config::RateLimitConfig;
use crate::limiter::Unit;

/// The labels a per-limit stats key maps to: domain, then up to two levels.
pub(crate) type LabelSet = (String, Option<String>, Option<String>);

pub(crate) fn label_set(name: &str) -> LabelSet {
    let mut parts = name.split('.');
    let domain = parts.next().unwrap_or_default().to_owned();
    let key1 = parts.next().map(str::to_owned);
    let key2 = parts.next().map(str::to_owned);
    (domain, key1, key2)
}

/// A configured limit as its gauges report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitShape {
    pub requests_per_unit: u32,
    pub unit: Unit,
    pub unit_multiplier: u32,
    /// Each of the limit's stats keys counts one counter, so its hits can be compared with the
    /// limit (`crate::config::Limit::stats_key_is_one_counter`).
    pub one_counter: bool,
}

impl LimitShape {
    /// The window's length: `unit_multiplier` units.
    pub fn window_secs(&self) -> u64 {
        self.unit.secs() * u64::from(self.unit_multiplier)
    }
}

/// The loaded config's limits (the unlimited left out), by full key.
pub type LimitTable = HashMap<Box<str>, LimitShape>;

/// [`limit_table`] of the config last asked about, kept while that config is served: at
/// 100,000 limits the table takes tens of milliseconds to build, and every scrape and flush
/// asks for it.
#[derive(Debug, Default)]
pub struct LimitTableCache(Mutex<Option<(Weak<RateLimitConfig>, Arc<LimitTable>)>>);

impl LimitTableCache {
    /// `config`'s table, built once per config.
    pub fn table(&self, config: &Arc<RateLimitConfig>) -> Arc<LimitTable> {
        let mut cached = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // The weak reference keeps the old config's allocation, so its address names it alone.
        if let Some((of, table)) = cached.as_ref()
            && std::ptr::eq(of.as_ptr(), Arc::as_ptr(config))
        {
            return Arc::clone(table);
        }
        let table = Arc::new(limit_table(config));
        *cached = Some((Arc::downgrade(config), Arc::clone(&table)));
        table
    }
}

/// Every limited limit of `config`, each as its slowest block.
pub fn limit_table(config: &RateLimitConfig) -> LimitTable {
    config
        .limits()
        .filter_map(|l| {
            let q = l.slowest_block()?;
            let shape = LimitShape {
                requests_per_unit: q.requests_per_unit,
                unit: q.unit,
                unit_multiplier: q.unit_multiplier,
                one_counter: l.stats_key_is_one_counter,
            };
            Some((l.full_key.as_str().into(), shape))
        })
        .collect()
}

/// The limit one stats key counts against, if it is still configured (or an override).
pub fn entry_limit(entry: &Entry, limits: &LimitTable) -> Option<LimitShape> {
    match &entry.source {
        Source::Limit(full_key) => limits.get(full_key).copied(),
        Source::Override(_) => entry
            .source
            .override_limit()
            .map(|(limit, unit)| LimitShape {
                requests_per_unit: limit,
                unit,
                unit_multiplier: 1,
                one_counter: true,
            }),
        Source::Overflow => None,
    }
}

/// One label set's gauges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitGauge {
    /// requests_per_unit; the sum of them when several limits of one window share the series.
    pub requests_per_unit: u64,
    pub window_secs: u64,
    /// The first limit's (by stats key) when several share the series.
    pub unit: Unit,
    pub unit_multiplier: u32,
    /// The series counts exactly one counter: one stats key, of a limit whose keys each count
    /// one counter. Only then is `hits / limit` one tenant's share of its limit.
    pub one_counter: bool,
}

/// A gauge family of the configured limit: its name, help, and the value a [`LimitGauge`] gives.
pub type GaugeFamily = (&'static str, &'static str, fn(&LimitGauge) -> u64);

/// The numeric gauges, in the order exported (`sluice_rate_limit_info` follows them). The first
/// is named as in envoyproxy/ratelimit's unmerged PR #1138, so a dashboard written for it works.
pub const GAUGE_FAMILIES: [GaugeFamily; 3] = [
    (
        "ratelimit_service_rate_limit_limit",
        "The limit's requests_per_unit (summed when limits of one window share the series).",
        |g| g.requests_per_unit,
    ),
    (
        "sluice_rate_limit_window_seconds",
        "The limit's window: unit_multiplier units, in seconds.",
        |g| g.window_secs,
    ),
    (
        "sluice_rate_limit_unit_multiplier",
        "The limit's unit_multiplier (1 unless set).",
        |g| u64::from(g.unit_multiplier),
    ),
];

/// The info gauge: 1 per series, labelled with the unit and `counters`.
pub const INFO_FAMILY: (&str, &str) = (
    "sluice_rate_limit_info",
    "1 per limit series: its unit, and counters=\"one\" when the series counts one counter (its \
     hits can be divided by the limit) or \"many\" (a key-only or wildcard level sums every \
     value's counter, or several limits share the series).",
);

impl LimitGauge {
    /// The info gauge's labels beyond the series': `unit` and `counters`.
    pub fn info_labels(&self) -> [(&'static str, &'static str); 2] {
        let counters = if self.one_counter { "one" } else { "many" };
        [("unit", self.unit.name()), ("counters", counters)]
    }
}

/// What the stats keys of one label set add up to, `None` once two of them disagree on the
/// window (their sum would mean nothing).
type Group = Option<(LimitGauge, usize)>;

/// The gauges of every label set that has a stats key with a known limit. Several keys can
/// share a label set (levels past the second, or keys that sanitise alike): their counters add
/// up in the series, and so do their limits when their windows agree; when they do not, the
/// label set gets no gauges.
pub fn limit_gauges(stats: &Stats, limits: &LimitTable) -> BTreeMap<LabelSet, LimitGauge> {
    let mut entries = stats.entries();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let mut groups: BTreeMap<LabelSet, Group> = BTreeMap::new();
    for entry in &entries {
        let Some(shape) = entry_limit(entry, limits) else {
            continue;
        };
        let gauge = LimitGauge {
            requests_per_unit: u64::from(shape.requests_per_unit),
            window_secs: shape.window_secs(),
            unit: shape.unit,
            unit_multiplier: shape.unit_multiplier,
            one_counter: shape.one_counter,
        };
        groups
            .entry(label_set(&entry.name))
            .and_modify(|group| {
                *group = group.and_then(|(sum, n)| {
                    (sum.window_secs == gauge.window_secs).then(|| {
                        let requests_per_unit = sum.requests_per_unit + gauge.requests_per_unit;
                        (
                            LimitGauge {
                                requests_per_unit,
                                ..sum
                            },
                            n + 1,
                        )
                    })
                });
            })
            .or_insert(Some((gauge, 1)));
    }
    groups
        .into_iter()
        .filter_map(|(labels, group)| {
            let (gauge, n) = group?;
            let one_counter = gauge.one_counter && n == 1;
            Some((
                labels,
                LimitGauge {
                    one_counter,
                    ..gauge
                },
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LoadOptions, parse_files};
    use crate::telemetry::stats::{KeySource, Outcome};

    fn config(yaml: &str) -> RateLimitConfig {
        parse_files(
            &[("c.yaml".to_owned(), yaml.to_owned())],
            &LoadOptions::default(),
        )
        .expect("config loads")
    }

    fn hit(stats: &Stats, key: &str, source: KeySource<'_>, limit: u32) {
        stats.record_dynamic(key, source, &Outcome::admitted(1, limit));
    }

    fn labels(domain: &str, key1: &str, key2: Option<&str>) -> LabelSet {
        (domain.into(), Some(key1.into()), key2.map(Into::into))
    }

    const CONFIG: &str = r#"
domain: d
descriptors:
  - key: tenant
    value: acme
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: user
    detailed_metric: true
    rate_limits:
      - {unit: second, requests_per_unit: 10}
      - {unit: hour, requests_per_unit: 3600, unit_multiplier: 2}
  - key: a
    value: x
    descriptors:
      - key: b
        value: y
        descriptors:
          - {key: c, value: "1", rate_limit: {unit: minute, requests_per_unit: 10}}
          - {key: c, value: "2", rate_limit: {unit: minute, requests_per_unit: 20}}
          - {key: e, value: "1", rate_limit: {unit: hour, requests_per_unit: 20}}
      - key: f
        value: z
        descriptors:
          - {key: c, value: "1", rate_limit: {unit: minute, requests_per_unit: 10}}
          - {key: c, value: "2", rate_limit: {unit: minute, requests_per_unit: 20}}
"#;

    /// The table is built once per served config: the same config answers the same table,
    /// a new one (a reload, a runtime limit) a new table of its own limits.
    #[test]
    fn the_table_is_built_once_per_config() {
        let cache = LimitTableCache::default();
        let first = Arc::new(config(CONFIG));
        let table = cache.table(&first);
        assert_eq!(*table, limit_table(&first));
        assert!(Arc::ptr_eq(&table, &cache.table(&first)), "kept");
        let second = Arc::new(config(
            "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: second, requests_per_unit: 1}}\n",
        ));
        let other = cache.table(&second);
        assert!(!Arc::ptr_eq(&table, &other));
        assert_eq!(other.keys().collect::<Vec<_>>(), [&Box::<str>::from("d.k")]);
        drop(first);
        assert!(Arc::ptr_eq(&other, &cache.table(&second)));
    }

    #[test]
    fn each_label_set_reports_its_configured_limit() {
        let table = limit_table(&config(CONFIG));
        let stats = Stats::default();
        hit(
            &stats,
            "d.tenant_acme",
            KeySource::Limit("d.tenant_acme"),
            100,
        );
        hit(&stats, "d.ip", KeySource::Limit("d.ip"), 5);
        hit(&stats, "d.user_bob", KeySource::Limit("d.user"), 1);
        hit(&stats, "d.k_v", KeySource::Override(Unit::Hour), 7);
        hit(&stats, "d.k_v", KeySource::Override(Unit::Day), 9);
        hit(&stats, "d.gone", KeySource::Limit("d.gone"), 1);
        let g = limit_gauges(&stats, &table);
        let tenant = g[&labels("d", "tenant_acme", None)];
        assert_eq!(
            (tenant.requests_per_unit, tenant.window_secs, tenant.unit),
            (100, 60, Unit::Minute)
        );
        assert!(tenant.one_counter);
        assert!(
            !g[&labels("d", "ip", None)].one_counter,
            "every address's hits"
        );
        // 10/s against 3600 per 2 h: the second binds.
        let user = g[&labels("d", "user_bob", None)];
        assert_eq!(
            (
                user.requests_per_unit,
                user.window_secs,
                user.unit_multiplier
            ),
            (3600, 7200, 2)
        );
        assert!(user.one_counter);
        let over = g[&labels("d", "k_v", None)];
        assert_eq!(
            (over.requests_per_unit, over.unit),
            (9, Unit::Day),
            "the last override"
        );
        assert!(!g.contains_key(&labels("d", "gone", None)), "no such limit");
    }

    #[test]
    fn limits_sharing_a_series_add_up_when_their_windows_agree() {
        let table = limit_table(&config(CONFIG));
        let stats = Stats::default();
        for k in ["d.a_x.b_y.c_1", "d.a_x.b_y.c_2", "d.a_x.f_z.c_1"] {
            hit(&stats, k, KeySource::Limit(k), 1);
        }
        hit(
            &stats,
            "d.a_x.f_z.c_2",
            KeySource::Limit("d.a_x.f_z.c_2"),
            1,
        );
        let g = limit_gauges(&stats, &table);
        let b = g[&labels("d", "a_x", Some("b_y"))];
        assert_eq!((b.requests_per_unit, b.window_secs), (30, 60));
        assert!(!b.one_counter, "two counters");
        hit(
            &stats,
            "d.a_x.b_y.e_1",
            KeySource::Limit("d.a_x.b_y.e_1"),
            1,
        );
        let g = limit_gauges(&stats, &table);
        assert!(
            !g.contains_key(&labels("d", "a_x", Some("b_y"))),
            "minutes and hours do not add up"
        );
        assert_eq!(g[&labels("d", "a_x", Some("f_z"))].requests_per_unit, 30);
    }

    #[test]
    fn a_reload_changes_or_removes_a_limit_at_the_next_read() {
        let stats = Stats::default();
        hit(
            &stats,
            "d.tenant_acme",
            KeySource::Limit("d.tenant_acme"),
            100,
        );
        let before = limit_gauges(&stats, &limit_table(&config(CONFIG)));
        assert_eq!(before.len(), 1);
        let changed = CONFIG.replace("requests_per_unit: 100}", "requests_per_unit: 250}");
        let after = limit_gauges(&stats, &limit_table(&config(&changed)));
        assert_eq!(
            after[&labels("d", "tenant_acme", None)].requests_per_unit,
            250
        );
        let removed = config(
            "domain: d\ndescriptors:\n  - key: other\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        );
        assert!(limit_gauges(&stats, &limit_table(&removed)).is_empty());
    }
}
