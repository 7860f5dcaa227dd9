//! The configured limits beside the per-limit series, so a dashboard can divide the hits by
//! them, at a price of one series per stats key and one per limit:
//!
//! - per label set of the per-limit counters (same labels, same SLUICE_MAX_STAT_KEYS cap: only
//!   keys that have stats get one), `ratelimit_service_rate_limit_limit{domain, key1[, key2],
//!   limit, counters}`: the requests_per_unit of the limit the series counts against, named
//!   by `limit` (its config path), and whether the series counts one counter;
//! - per limit that such a series names, `sluice_rate_limit_window_seconds{limit, unit,
//!   unit_multiplier, algorithm}`: its window in seconds, and the rest of its shape as labels.
//!
//! The window, unit and multiplier are the limit's, the same for each of its keys: a
//! `detailed_metric` limit with 3,000 values has 3,000 limit gauges and one window, not 3,000
//! of each (issue 50). The limit gauge stays per key because it is the link a query joins on
//! (`on (instance, limit)`) and what PR #1138's dashboards divide by.
//!
//! The values are looked up when the exporters read them, in the config loaded at that moment
//! ([`LimitTable`]), by the configured limit each stats key counts against: a limit a reload
//! changes reports its new value at the next scrape, and one it removes reports none. A
//! per-request override is a limit of its own, named by its stats key, reporting the last
//! override a request carried.
//!
//! A limit with several blocks (`rate_limits`) reports its slowest block: the lowest
//! requests_per_unit over window, which is the one that binds hits that come steadily (the
//! highest of the blocks' utilisations at a steady rate).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use super::stats::{Entry, Source, Stats};
use crate::config::RateLimitConfig;
use crate::limiter::{Algorithm, Unit};

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
    pub algorithm: Algorithm,
    /// Each of the limit's stats keys counts one counter, so its hits can be compared with the
    /// limit (`crate::config::Limit::stats_key_is_one_counter`).
    pub one_counter: bool,
}

impl LimitShape {
    /// The window's length: `unit_multiplier` units.
    pub fn window_secs(&self) -> u64 {
        self.unit.secs() * u64::from(self.unit_multiplier)
    }

    /// The window gauge's labels beyond `limit`: `unit`, `unit_multiplier`, `algorithm`.
    pub fn labels(&self) -> [(&'static str, String); 3] {
        [
            ("unit", self.unit.name().to_owned()),
            ("unit_multiplier", self.unit_multiplier.to_string()),
            ("algorithm", self.algorithm.name().to_owned()),
        ]
    }
}

/// The loaded config's limits (the unlimited left out), by full key.
pub(crate) type LimitTable = HashMap<Box<str>, LimitShape>;

/// [`limit_table`] of the config last asked about, kept while that config is served: at
/// 100,000 limits the table takes tens of milliseconds to build, and every scrape and flush
/// asks for it.
#[derive(Debug, Default)]
pub(crate) struct LimitTableCache(Mutex<Option<(Weak<RateLimitConfig>, Arc<LimitTable>)>>);

impl LimitTableCache {
    /// `config`'s table, built once per config.
    pub(crate) fn table(&self, config: &Arc<RateLimitConfig>) -> Arc<LimitTable> {
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
                algorithm: q.algorithm,
                one_counter: l.stats_key_is_one_counter,
            };
            Some((l.full_key.as_str().into(), shape))
        })
        .collect()
}

/// The limit one stats key counts against, if it is still configured (or an override): its
/// name (a configured limit's full key; an override's stats key) and shape.
pub(crate) fn entry_limit<'e>(
    entry: &'e Entry,
    limits: &LimitTable,
) -> Option<(&'e str, LimitShape)> {
    match &entry.source {
        Source::Limit(full_key) => Some((full_key, *limits.get(full_key)?)),
        Source::Override(_) => entry.source.override_limit().map(|(limit, unit)| {
            let shape = LimitShape {
                requests_per_unit: limit,
                unit,
                unit_multiplier: 1,
                algorithm: Algorithm::FixedWindow,
                one_counter: true,
            };
            (&*entry.name, shape)
        }),
        Source::Overflow => None,
    }
}

/// One label set's limit gauge, for one limit its keys count against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KeyLimit {
    pub requests_per_unit: u64,
    /// The series counts exactly one counter: one stats key, of a limit whose keys each count
    /// one counter. Only then is `hits / limit` one tenant's share of its limit.
    pub one_counter: bool,
}

impl KeyLimit {
    /// The `counters` label: `one` or `many`.
    pub(crate) fn counters(&self) -> &'static str {
        if self.one_counter { "one" } else { "many" }
    }
}

/// The per-key limit gauge: its name and help.
pub(crate) const KEY_FAMILY: (&str, &str) = (
    "ratelimit_service_rate_limit_limit",
    "The requests_per_unit of the limit (named by limit) the series counts against; counters=\"one\" \
     when the series counts one counter (its hits can be divided by the limit), \"many\" when a \
     key-only or wildcard level sums every value's counter or several keys share the series.",
);

/// The per-limit window gauge: its name and help.
pub(crate) const LIMIT_FAMILY: (&str, &str) = (
    "sluice_rate_limit_window_seconds",
    "The limit's window in seconds (unit_multiplier units), one series per limit, with its unit, \
     unit_multiplier and algorithm.",
);

/// What the exporters report of the configured limits: the limit gauge of each (label set,
/// limit name), and the shape of each limit named.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LimitReport {
    pub keys: BTreeMap<(LabelSet, String), KeyLimit>,
    pub limits: BTreeMap<String, LimitShape>,
}

/// The limit gauges of every label set that has a stats key with a known limit, and the
/// limits they name. Several keys can share a label set (levels past the second, or keys that
/// sanitise alike): their counters add up in the series, so the series counts many counters,
/// and it gets one limit gauge per limit among them.
pub(crate) fn limit_report(stats: &Stats, table: &LimitTable) -> LimitReport {
    let mut entries = stats.entries();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let mut sets: BTreeMap<LabelSet, Vec<(&str, LimitShape)>> = BTreeMap::new();
    for entry in &entries {
        if let Some(limit) = entry_limit(entry, table) {
            sets.entry(label_set(&entry.name)).or_default().push(limit);
        }
    }
    let mut report = LimitReport::default();
    for (labels, limits) in sets {
        let alone = limits.len() == 1;
        for (name, shape) in limits {
            report.keys.insert(
                (labels.clone(), name.to_owned()),
                KeyLimit {
                    requests_per_unit: u64::from(shape.requests_per_unit),
                    one_counter: alone && shape.one_counter,
                },
            );
            // An override named like a configured limit would give one name two shapes; the
            // first kept keeps the exposition free of duplicate series.
            report.limits.entry(name.to_owned()).or_insert(shape);
        }
    }
    report
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

    /// The limit gauge of `labels` for the limit `name`.
    fn key(r: &LimitReport, labels: LabelSet, name: &str) -> Option<KeyLimit> {
        r.keys.get(&(labels, name.to_owned())).copied()
    }

    #[test]
    fn each_label_set_reports_its_configured_limit_and_each_limit_its_window_once() {
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
        hit(&stats, "d.user_eve", KeySource::Limit("d.user"), 1);
        hit(&stats, "d.k_v", KeySource::Override(Unit::Hour), 7);
        hit(&stats, "d.k_v", KeySource::Override(Unit::Day), 9);
        hit(&stats, "d.gone", KeySource::Limit("d.gone"), 1);
        let r = limit_report(&stats, &table);
        let tenant = key(&r, labels("d", "tenant_acme", None), "d.tenant_acme");
        assert_eq!(
            tenant,
            Some(KeyLimit {
                requests_per_unit: 100,
                one_counter: true
            })
        );
        let ip = key(&r, labels("d", "ip", None), "d.ip").unwrap();
        assert!(!ip.one_counter, "every address's hits");
        // 10/s against 3600 per 2 h: the second binds. Two values, one window.
        for user in ["user_bob", "user_eve"] {
            let k = key(&r, labels("d", user, None), "d.user").unwrap();
            assert_eq!((k.requests_per_unit, k.one_counter), (3600, true));
        }
        let user = r.limits["d.user"];
        assert_eq!(
            (user.window_secs(), user.unit_multiplier, user.algorithm),
            (7200, 2, Algorithm::FixedWindow)
        );
        // An override is a limit of its own, named by its stats key: the last one carried.
        let over = key(&r, labels("d", "k_v", None), "d.k_v").unwrap();
        assert_eq!(over.requests_per_unit, 9);
        assert_eq!(r.limits["d.k_v"].unit, Unit::Day);
        assert!(
            !r.keys.keys().any(|(_, name)| name == "d.gone"),
            "no such limit"
        );
        assert_eq!(
            r.limits.keys().collect::<Vec<_>>(),
            ["d.ip", "d.k_v", "d.tenant_acme", "d.user"]
        );
        assert_eq!(r.keys.len(), 5);
    }

    #[test]
    fn limits_sharing_a_series_each_have_a_gauge_and_count_many() {
        let table = limit_table(&config(CONFIG));
        let stats = Stats::default();
        for k in ["d.a_x.b_y.c_1", "d.a_x.b_y.c_2", "d.a_x.b_y.e_1"] {
            hit(&stats, k, KeySource::Limit(k), 1);
        }
        let r = limit_report(&stats, &table);
        let b = labels("d", "a_x", Some("b_y"));
        let gauges: Vec<(&str, u64, bool)> = r
            .keys
            .iter()
            .filter(|((l, _), _)| *l == b)
            .map(|((_, name), k)| (name.as_str(), k.requests_per_unit, k.one_counter))
            .collect();
        assert_eq!(
            gauges,
            [
                ("d.a_x.b_y.c_1", 10, false),
                ("d.a_x.b_y.c_2", 20, false),
                ("d.a_x.b_y.e_1", 20, false)
            ]
        );
        assert_eq!(r.limits["d.a_x.b_y.e_1"].window_secs(), 3600);
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
        let tenant = (labels("d", "tenant_acme", None), "d.tenant_acme".to_owned());
        let before = limit_report(&stats, &limit_table(&config(CONFIG)));
        assert_eq!(before.keys.len(), 1);
        let changed = CONFIG.replace("requests_per_unit: 100}", "requests_per_unit: 250}");
        let after = limit_report(&stats, &limit_table(&config(&changed)));
        assert_eq!(after.keys[&tenant].requests_per_unit, 250);
        let removed = config(
            "domain: d\ndescriptors:\n  - key: other\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        );
        assert_eq!(
            limit_report(&stats, &limit_table(&removed)),
            LimitReport::default()
        );
    }
}
