//! The Prometheus text exposition (format 0.0.4), written by hand: a few families of plain
//! numbers need no client library.
//!
//! Names are what envoyproxy/ratelimit's default statsd-exporter mapping
//! (`src/stats/prom/default_mapper.yaml`) produces, so existing dashboards keep working:
//!
//! - `ratelimit.service.rate_limit.<domain>.<k1>[.<k2>[...]].<stat>` becomes
//!   `ratelimit_service_rate_limit_<stat>{domain, key1[, key2]}`. As in the mapping, levels past
//!   the second are not labels: their series add up into the `key2` series.
//! - `ratelimit.service.call.should_rate_limit.<err>` becomes
//!   `ratelimit_service_should_rate_limit_error{err_type}`.
//! - `ratelimit_server.ShouldRateLimit.{total_requests,response_time}` become
//!   `ratelimit_service_total_requests{grpc_method}` and the histogram
//!   `ratelimit_service_response_time_seconds{grpc_method}`.
//!
//! The mapping exports its counters without the `_total` suffix that Prometheus's linter wants
//! on a `counter`; these families are declared `untyped` so the names stay as dashboards know
//! them and `promtool check metrics` stays clean (PromQL's `rate()` does not look at the type).
//! Sluice's own metrics (`sluice_*`) follow the naming conventions.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use super::limits::{KEY_FAMILY, LIMIT_FAMILY, LabelSet, LimitTable, label_set, limit_report};
use super::stats::{LimitCounters, Stats};

/// The content type of this exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Numbers from outside [`Stats`] that the exposition reports.
#[derive(Clone, Debug, Default)]
pub struct Extra {
    /// The loaded config's limits, for the configured-limit gauges.
    pub limits: std::sync::Arc<LimitTable>,
    pub config_load_success: u64,
    pub config_load_error: u64,
    /// What the counter store reports of itself.
    pub store: StoreReport,
    /// The tracer's counters, (name, help, value); empty when TRACING_ENABLED is off.
    pub tracing: Vec<(&'static str, &'static str, u64)>,
    /// Each serving listener's connections, requests in flight and refusals.
    pub listeners: Vec<ListenerGauges>,
    /// gRPC message bytes being received right now (SLUICE_MAX_PENDING_REQUEST_BYTES's budget).
    pub pending_request_bytes: u64,
    /// The Rate Limit Quota Service's numbers.
    pub rlqs: Option<RlqsGauges>,
    /// The runtime limits: how many are set, and the changes made through this node's API.
    pub runtime: RuntimeGauges,
}

/// What a counter store reports of itself, each backend filling its own parts (the peer
/// cluster: its local memory store, its own numbers and its write-behind's Redis).
#[derive(Clone, Debug, Default)]
pub struct StoreReport {
    pub memory: Option<MemoryGauges>,
    pub cluster: Option<ClusterGauges>,
    /// Each Redis in use: the backend's (`main`, `per_second`) or the write-behind's.
    pub redis: Vec<BreakerGauges>,
    /// Each memcached server of the memcache backend.
    pub memcache: Vec<BreakerGauges>,
    /// SLUICE_REDIS_ALLOWANCE's counters, then its gauges ([`ALLOWANCE_GAUGES`]); empty when
    /// it is off.
    pub allowance: Vec<(&'static str, u64)>,
}

/// The runtime limits' numbers (`sluice_runtime_limits`, `sluice_runtime_limit_changes_total`,
/// and a peer cluster's `sluice_runtime_limit_syncs_total` and
/// `sluice_runtime_limit_missed_pushes_total`).
#[derive(Clone, Copy, Debug, Default)]
pub struct RuntimeGauges {
    pub limits: u64,
    pub puts: u64,
    pub deletes: u64,
    /// The anti-entropy comparisons by result: [`SYNC_RESULTS`].
    pub syncs: [u64; 3],
    /// Pushes a peer did not take.
    pub missed_pushes: u64,
}

/// The `result` label of `sluice_runtime_limit_syncs_total`, in [`RuntimeGauges::syncs`]' order.
pub(crate) const SYNC_RESULTS: [&str; 3] = ["same", "differed", "failed"];

/// The Rate Limit Quota Service's counters, table sizes and busiest buckets.
#[derive(Clone, Debug, Default)]
pub struct RlqsGauges {
    /// (name, value): reports, assignments, pushed, malformed, refused, abandoned, expired.
    pub counters: Vec<(&'static str, u64)>,
    /// (name, value): streams, buckets, holders, bytes.
    pub gauges: Vec<(&'static str, u64)>,
    /// The buckets with the most demand, at most [`RLQS_METRIC_BUCKETS`]: (bucket key, attempted
    /// and assigned requests per second).
    pub buckets: Vec<(String, f64, f64)>,
}

/// How many buckets `/metrics` shows demand and assignment for: the busiest, so the label set
/// stays bounded whatever Envoys report.
pub(crate) const RLQS_METRIC_BUCKETS: usize = 100;

/// One listener's numbers (see [`crate::net`]).
#[derive(Clone, Debug, Default)]
pub struct ListenerGauges {
    /// Its setting: `GRPC_PORT`, `PORT`, `DEBUG_PORT`, ...
    pub port: &'static str,
    pub connections: u64,
    pub inflight_requests: u64,
    /// (reason, count): `inflight`, `deadline`, `message_size`, `pending_bytes`.
    pub refused: [(&'static str, u64); 4],
    pub idle_closed: u64,
}

/// The peer cluster's counters and each peer's state.
#[derive(Clone, Debug, Default)]
pub struct ClusterGauges {
    pub local_hits: u64,
    pub forwarded_hits: u64,
    pub peer_calls: u64,
    pub failed_forwards: u64,
    /// Hits decided alone without a majority of the peers, and whether this node has one.
    pub alone_hits: u64,
    pub majority: bool,
    /// Hits relayed to their previous owner while this node joins, relays that failed,
    /// counters taken over from it, and whether the join has yet to settle (docs/cluster.md,
    /// "A node joining").
    pub relayed_hits: u64,
    pub failed_relays: u64,
    pub taken_over: u64,
    pub joining: bool,
    /// SLUICE_PEER_WRITE_BEHIND's counters, (name, value); empty when it is off.
    pub durable: Vec<(&'static str, u64)>,
    /// Lease mode's counters, then its gauges ([`LEASE_GAUGES`]), (name, value); empty outside
    /// lease mode.
    pub lease: Vec<(&'static str, u64)>,
    /// (address, up).
    pub peers: Vec<(String, bool)>,
    /// SLUICE_LEASE_PARENT's link, for the status page; `None` without a parent.
    pub parent: Option<ParentGauges>,
}

/// A lease cluster's link to its parent cluster (docs/cluster.md, "Regions").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParentGauges {
    /// SLUICE_LEASE_PARENT's addresses, comma-separated.
    pub peers: String,
    /// Whether any call to the parent ever succeeded.
    pub reached: bool,
    /// Whether calls to the parent are failing now.
    pub unreachable: bool,
    /// The safe capacity's divisor for a limit without a YAML `safe_capacity`: the clusters
    /// the parent last counted, or (`expected`) SLUICE_LEASE_PARENT_EXPECTED_CLUSTERS.
    pub clusters: u32,
    pub expected: bool,
}

/// One Redis's or memcached server's breaker (see `src/store/breaker.rs`).
#[derive(Clone, Debug, Default)]
pub struct BreakerGauges {
    /// A Redis's role (`main`, `per_second` or `write_behind`); a memcached server's address.
    pub target: String,
    pub up: bool,
    pub opens: u64,
    pub fast_failures: u64,
}

/// The memory store's counters.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryGauges {
    pub live_counters: u64,
    pub max_counters: u64,
    /// The live counters' accounted bytes, and SLUICE_MAX_COUNTER_BYTES.
    pub counter_bytes: u64,
    pub max_counter_bytes: u64,
    pub rejected_full: u64,
    pub swept: u64,
    /// Penalties (`penalty_seconds`) not kept: as many were in force as counters may live.
    pub penalties_dropped: u64,
}

/// Escapes a label value: backslash, double quote and newline.
fn escape(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(k);
            out.push_str("=\"");
            escape(out, v);
            out.push('"');
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

const STAT_HELP: [&str; LimitCounters::COUNT] = [
    "Hits counted against the limit.",
    "Hits over the limit.",
    "Hits within the limit but past NEAR_LIMIT_RATIO of it.",
    "Hits within the limit.",
    "Over-limit hits let through by the limit's shadow_mode.",
    "Over-limit hits answered from the local over-limit cache.",
    "Hits refunded by descriptors with is_negative_hits.",
    "Refunded hits not taken off, as the limit does not count refused hits (SLUICE_NEGATIVE_HITS).",
    "Concurrency slots taken by admitted starts (algorithm: concurrency).",
    "Concurrency slots given back by refunds (a refund of a refused start gives back none).",
    "Concurrency slots that expired one window after they were taken, their refund never come: each a lost refund.",
    "Penalties started (penalty_seconds): refusals by the limit's counter, each refusing the key for the penalty's length.",
    "Hits refused by a penalty in force, without reaching the counter (also in over_limit).",
];

/// `sluice_rate_limit_slots_held`: a concurrency limit's slots held, per series that ever took one.
const SLOTS_HELD: (&str, &str) = (
    "sluice_rate_limit_slots_held",
    "Concurrency slots held: taken less given back less expired, by this replica's calls (sum over replicas).",
);

/// Per-limit stats, summed per label set (keys deeper than two levels, and keys that sanitise
/// to the same name, share a series). The OTLP metrics read the same series.
pub(crate) fn limit_series(stats: &Stats) -> BTreeMap<LabelSet, [u64; LimitCounters::COUNT]> {
    let mut series: BTreeMap<LabelSet, [u64; LimitCounters::COUNT]> = BTreeMap::new();
    for entry in stats.entries() {
        let values = entry.counters.values();
        let sums = series.entry(label_set(&entry.name)).or_default();
        for (s, v) in sums.iter_mut().zip(values) {
            *s += v;
        }
    }
    series
}

fn load(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// Renders every metric.
pub fn render(stats: &Stats, extra: &Extra) -> String {
    let mut out = String::with_capacity(4096);
    render_limits(&mut out, stats);
    render_limit_gauges(&mut out, stats, &extra.limits);
    render_calls(&mut out, stats);
    render_latency(&mut out, stats);
    render_service_counters(&mut out, stats, extra);
    render_stats_keys(&mut out, stats);
    if let Some(m) = extra.store.memory {
        render_memory(&mut out, m);
    }
    if let Some(c) = &extra.store.cluster {
        render_cluster(&mut out, c);
    }
    breakers(&mut out, REDIS_BREAKERS, &extra.store.redis);
    render_allowance(&mut out, &extra.store.allowance);
    breakers(&mut out, MEMCACHE_BREAKERS, &extra.store.memcache);
    for (name, help, value) in &extra.tracing {
        let name = format!("{name}_total");
        header(&mut out, &name, "counter", help);
        sample(&mut out, &name, &[], *value);
    }
    render_listeners(&mut out, extra);
    if let Some(r) = &extra.rlqs {
        render_rlqs(&mut out, r);
    }
    render_runtime(&mut out, extra.runtime);
    out
}

/// `sluice_runtime_limits` and `sluice_runtime_limit_changes_total{op}`, always (at 0 with the
/// API off), so a dashboard's panel has a series from the start.
fn render_runtime(out: &mut String, r: RuntimeGauges) {
    let limits = "sluice_runtime_limits";
    header(
        out,
        limits,
        "gauge",
        "Runtime limits set on this node, all domains (docs/runtime-limits.md).",
    );
    sample(out, limits, &[], r.limits);
    let changes = "sluice_runtime_limit_changes_total";
    header(
        out,
        changes,
        "counter",
        "Runtime limit changes made through this node's API, by op (put or delete).",
    );
    sample(out, changes, &[("op", "put")], r.puts);
    sample(out, changes, &[("op", "delete")], r.deletes);
    let syncs = "sluice_runtime_limit_syncs_total";
    header(
        out,
        syncs,
        "counter",
        "A peer cluster's runtime limit digests compared with a peer's, by result (same; differed, then reconciled; failed).",
    );
    for (result, n) in SYNC_RESULTS.iter().zip(r.syncs) {
        sample(out, syncs, &[("result", result)], n);
    }
    let missed = "sluice_runtime_limit_missed_pushes_total";
    header(
        out,
        missed,
        "counter",
        "Runtime limit changes a peer did not take when pushed (each brought by the next anti-entropy pass).",
    );
    sample(out, missed, &[], r.missed_pushes);
}

/// `sluice_rlqs_*`: the quota service's counters, table sizes, and the busiest buckets' demand
/// and assignment.
/// The allowance numbers that are gauges (the table's size); the others are counters.
pub(crate) const ALLOWANCE_GAUGES: [&str; 2] = ["keys", "bytes"];

/// SLUICE_REDIS_ALLOWANCE's counters and gauges.
fn render_allowance(out: &mut String, allowance: &[(&'static str, u64)]) {
    for (stat, value) in allowance {
        let (name, kind, help) = if ALLOWANCE_GAUGES.contains(stat) {
            (
                format!("sluice_redis_allowance_{stat}"),
                "gauge",
                "Redis allowances: keys with a batch, and the bytes charged for them.",
            )
        } else {
            (
                format!("sluice_redis_allowance_{stat}_total"),
                "counter",
                "Redis allowances: calls decided from batches or sent to Redis, reservations, hits given back (see docs/redis.md).",
            )
        };
        header(out, &name, kind, help);
        sample(out, &name, &[], *value);
    }
}

fn render_rlqs(out: &mut String, r: &RlqsGauges) {
    for (stat, value) in &r.counters {
        let name = format!("sluice_rlqs_{stat}_total");
        header(
            out,
            &name,
            "counter",
            "Rate Limit Quota Service (see docs/rlqs.md).",
        );
        sample(out, &name, &[], *value);
    }
    for (stat, value) in &r.gauges {
        let name = format!("sluice_rlqs_{stat}");
        header(
            out,
            &name,
            "gauge",
            "Rate Limit Quota Service: open streams, buckets, Envoys' parts of them, bytes charged.",
        );
        sample(out, &name, &[], *value);
    }
    for (i, (name, help)) in [
        ("sluice_rlqs_bucket_demand", "Requests per second Envoys attempted in a bucket (allowed and denied), for the busiest buckets."),
        ("sluice_rlqs_bucket_assigned", "Requests per second assigned to Envoys in a bucket, for the busiest buckets."),
    ]
    .into_iter()
    .enumerate()
    {
        header(out, name, "gauge", help);
        for (bucket, demand, assigned) in &r.buckets {
            let value = if i == 0 { demand } else { assigned };
            sample(out, name, &[("bucket", bucket)], value);
        }
    }
}

/// `ratelimit_service_rate_limit_<stat>{domain, key1, key2}`, one family per stat, each with
/// the series its stat applies to ([`LimitCounters::applies`]).
fn render_limits(out: &mut String, stats: &Stats) {
    let series = limit_series(stats);
    for (i, stat) in LimitCounters::NAMES.iter().enumerate() {
        let name = format!("ratelimit_service_rate_limit_{stat}");
        header(out, &name, "untyped", STAT_HELP[i]);
        for (labels, values) in &series {
            if LimitCounters::applies(values, i) {
                sample(out, &name, &labels_of(labels), values[i]);
            }
        }
    }
    let (name, help) = SLOTS_HELD;
    header(out, name, "gauge", help);
    for (labels, values) in series.iter().filter(|(_, v)| LimitCounters::holds_slots(v)) {
        sample(
            out,
            name,
            &labels_of(labels),
            LimitCounters::slots_held(values),
        );
    }
}

/// The configured limits beside the per-limit series ([`super::limits`]): the limit gauge of
/// each label set (and limit it counts against), and the window gauge of each limit once.
fn render_limit_gauges(out: &mut String, stats: &Stats, limits: &LimitTable) {
    let report = limit_report(stats, limits);
    let (name, help) = KEY_FAMILY;
    header(out, name, "gauge", help);
    for ((labels, limit), key) in &report.keys {
        let mut labels = labels_of(labels);
        labels.extend([("limit", limit.as_str()), ("counters", key.counters())]);
        sample(out, name, &labels, key.requests_per_unit);
    }
    let (name, help) = LIMIT_FAMILY;
    header(out, name, "gauge", help);
    for (limit, shape) in &report.limits {
        let info = shape.labels();
        let mut labels = vec![("limit", limit.as_str())];
        labels.extend(info.iter().map(|(k, v)| (*k, v.as_str())));
        sample(out, name, &labels, shape.window_secs());
    }
}

/// A per-limit series' labels: `domain`, then `key1` and `key2` when the key has them.
fn labels_of((domain, key1, key2): &LabelSet) -> Vec<(&'static str, &str)> {
    let mut labels = vec![("domain", domain.as_str())];
    labels.extend(key1.as_deref().map(|k| ("key1", k)));
    labels.extend(key2.as_deref().map(|k| ("key2", k)));
    labels
}

/// Unknown domains, failed calls and all calls.
fn render_calls(out: &mut String, stats: &Stats) {
    let name = "ratelimit_service_rate_limit_domain_not_found";
    header(
        out,
        name,
        "untyped",
        "Requests for a domain no config declares.",
    );
    let mut not_found = stats.domains_not_found();
    not_found.sort();
    for (domain, n) in &not_found {
        sample(out, name, &[("domain", domain)], n);
    }

    let svc = &stats.service;
    let name = "ratelimit_service_should_rate_limit_error";
    header(out, name, "untyped", "ShouldRateLimit calls that failed.");
    sample(
        out,
        name,
        &[("err_type", "redis_error")],
        load(&svc.redis_error),
    );
    sample(
        out,
        name,
        &[("err_type", "service_error")],
        load(&svc.service_error),
    );

    let name = "ratelimit_service_total_requests";
    header(out, name, "untyped", "ShouldRateLimit calls.");
    sample(
        out,
        name,
        &[("grpc_method", "ShouldRateLimit")],
        svc.total_requests.get(),
    );
}

/// The decision-latency histogram, in seconds, or milliseconds with
/// PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS (the Go service's legacy units, same name).
fn render_latency(out: &mut String, stats: &Stats) {
    let name = "ratelimit_service_response_time_seconds";
    let (scale, help) = if stats.options().response_time_in_millis {
        (
            1000.0,
            "Time to decide a ShouldRateLimit call, in milliseconds (PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS).",
        )
    } else {
        (1.0, "Time to decide a ShouldRateLimit call.")
    };
    header(out, name, "histogram", help);
    let h = stats.response_time.snapshot();
    let bucket = format!("{name}_bucket");
    for (le, count) in &h.buckets {
        let le = (le * scale).to_string();
        sample(
            out,
            &bucket,
            &[("grpc_method", "ShouldRateLimit"), ("le", &le)],
            count,
        );
    }
    sample(
        out,
        &bucket,
        &[("grpc_method", "ShouldRateLimit"), ("le", "+Inf")],
        h.count,
    );
    sample(
        out,
        &format!("{name}_sum"),
        &[("grpc_method", "ShouldRateLimit")],
        h.sum_secs * scale,
    );
    sample(
        out,
        &format!("{name}_count"),
        &[("grpc_method", "ShouldRateLimit")],
        h.count,
    );
}

/// Config loads and global shadow mode.
fn render_service_counters(out: &mut String, stats: &Stats, extra: &Extra) {
    for (name, help, value) in [
        (
            "ratelimit_service_config_load_success",
            "Config loads and reloads that succeeded.",
            extra.config_load_success,
        ),
        (
            "ratelimit_service_config_load_error",
            "Config loads and reloads that failed (the previous config was kept).",
            extra.config_load_error,
        ),
        (
            "ratelimit_service_global_shadow_mode",
            "OVER_LIMIT answers turned OK by SHADOW_MODE.",
            load(&stats.service.global_shadow_mode),
        ),
    ] {
        header(out, name, "untyped", help);
        sample(out, name, &[], value);
    }
    let svc = &stats.service;
    for (name, help, value) in [
        (
            "sluice_reservations_opened_total",
            "Reservations opened, one per reserving descriptor of an admitted request (docs/token-budgets.md).",
            &svc.reservations_opened,
        ),
        (
            "sluice_reservations_settled_total",
            "Reservations settled; opened minus settled over a period longer than the longest \
             stream is what was never settled (charged at its estimate).",
            &svc.reservations_settled,
        ),
        (
            "sluice_reservations_settled_late_total",
            "Settles after a window that held their estimate had ended (it kept the estimate).",
            &svc.reservations_settled_late,
        ),
    ] {
        header(out, name, "counter", help);
        sample(out, name, &[], load(value));
    }
}

/// The stats key cap and what it folded.
fn render_stats_keys(out: &mut String, stats: &Stats) {
    let name = "sluice_stats_keys";
    header(
        out,
        name,
        "gauge",
        "Distinct per-limit stats keys and unknown domains held (capped by SLUICE_MAX_STAT_KEYS).",
    );
    sample(out, name, &[], stats.key_count());
    let name = "sluice_stats_keys_max";
    header(out, name, "gauge", "SLUICE_MAX_STAT_KEYS.");
    sample(out, name, &[], stats.options().max_keys);
    let name = "sluice_stats_folded_total";
    header(
        out,
        name,
        "counter",
        "Records folded into the _overflow_ series because the stats key cap was reached.",
    );
    sample(out, name, &[], load(&stats.service.folded));
}

/// The memory store's gauges and counters.
fn render_memory(out: &mut String, m: MemoryGauges) {
    for (name, kind, help, value) in [
        (
            "sluice_memory_live_counters",
            "gauge",
            "Counters held by the memory store.",
            m.live_counters,
        ),
        (
            "sluice_memory_max_counters",
            "gauge",
            "SLUICE_MAX_COUNTERS.",
            m.max_counters,
        ),
        (
            "sluice_memory_used_bytes",
            "gauge",
            "Bytes the memory store's counters are accounted (keys plus a fixed overhead each).",
            m.counter_bytes,
        ),
        (
            "sluice_memory_budget_bytes",
            "gauge",
            "SLUICE_MAX_COUNTER_BYTES.",
            m.max_counter_bytes,
        ),
        (
            "sluice_memory_rejected_full_total",
            "counter",
            "Requests refused because the memory store was full (in count or in bytes).",
            m.rejected_full,
        ),
        (
            "sluice_memory_swept_total",
            "counter",
            "Expired counters removed by the sweeper.",
            m.swept,
        ),
        (
            "sluice_memory_penalties_dropped_total",
            "counter",
            "Penalties (penalty_seconds) not kept: SLUICE_MAX_COUNTERS penalties were in force.",
            m.penalties_dropped,
        ),
    ] {
        header(out, name, kind, help);
        sample(out, name, &[], value);
    }
}

/// The lease-mode numbers that are gauges (table sizes); the others are counters.
pub(crate) const LEASE_GAUGES: [&str; 8] = [
    "held_keys",
    "held_bytes",
    "leased_keys",
    "leased_bytes",
    "parent_keys",
    "parent_bytes",
    "parent_unreachable",
    "parent_never_reached",
];

/// The peer cluster's counters, write-behind counters and peers.
fn render_cluster(out: &mut String, c: &ClusterGauges) {
    for (name, help, value) in [
        (
            "sluice_cluster_local_hits_total",
            "Hits applied to counters this node owns.",
            c.local_hits,
        ),
        (
            "sluice_cluster_forwarded_hits_total",
            "Hits forwarded to their owner on another peer.",
            c.forwarded_hits,
        ),
        (
            "sluice_cluster_peer_calls_total",
            "Calls to peers carrying forwarded hits (batches).",
            c.peer_calls,
        ),
        (
            "sluice_cluster_failed_forwards_total",
            "Forwards that failed and were retried on the next owner.",
            c.failed_forwards,
        ),
        (
            "sluice_cluster_alone_hits_total",
            "Hits this node decided alone, within each limit's safe capacity, while it reached no majority of its peers.",
            c.alone_hits,
        ),
        (
            "sluice_cluster_relayed_hits_total",
            "Hits on keys this node took on by joining, sent to their previous owner (applied there, or to take the counter over).",
            c.relayed_hits,
        ),
        (
            "sluice_cluster_failed_relays_total",
            "Relays to a previous owner that failed; their hits were counted here.",
            c.failed_relays,
        ),
        (
            "sluice_cluster_taken_over_total",
            "Counters this node took over from their previous owner, which held a count of them.",
            c.taken_over,
        ),
    ] {
        header(out, name, "counter", help);
        sample(out, name, &[], value);
    }
    for (name, help, value) in [
        (
            "sluice_cluster_majority",
            "1 while this node reaches a majority of its peers (itself included); 0 while it decides alone.",
            c.majority,
        ),
        (
            "sluice_cluster_joining",
            "1 until this node's join settles (every peer routes its keys to it); hits are relayed meanwhile.",
            c.joining,
        ),
    ] {
        header(out, name, "gauge", help);
        sample(out, name, &[], u64::from(value));
    }
    render_durable(out, &c.durable);
    render_lease(out, &c.lease);
    render_peers(out, &c.peers);
}

/// SLUICE_PEER_WRITE_BEHIND's counters.
fn render_durable(out: &mut String, durable: &[(&'static str, u64)]) {
    for (stat, value) in durable {
        let name = format!("sluice_cluster_durable_{stat}_total");
        header(
            out,
            &name,
            "counter",
            "Peer cluster write-behind to Redis (see docs/cluster.md).",
        );
        sample(out, &name, &[], *value);
    }
}

/// Each peer, up or down as this node believes.
fn render_peers(out: &mut String, peers: &[(String, bool)]) {
    let name = "sluice_cluster_peer_up";
    header(
        out,
        name,
        "gauge",
        "1 when this node believes the peer is up.",
    );
    for (peer, up) in peers {
        sample(out, name, &[("peer", peer.as_str())], u64::from(*up));
    }
}

/// Lease mode's counters and gauges ([`LEASE_GAUGES`]).
fn render_lease(out: &mut String, lease: &[(&'static str, u64)]) {
    for (stat, value) in lease {
        let gauge = LEASE_GAUGES.contains(stat);
        let name = if gauge {
            format!("sluice_cluster_lease_{stat}")
        } else {
            format!("sluice_cluster_lease_{stat}_total")
        };
        let (kind, help) = if gauge {
            (
                "gauge",
                "Lease mode: keys (and bytes charged) this node holds leases on, leases as an owner, or holds a parent's grant for; 1 while the parent is unreachable, or has never answered since start.",
            )
        } else {
            (
                "counter",
                "Lease mode's decisions and calls (see docs/cluster.md).",
            )
        };
        header(out, &name, kind, help);
        sample(out, &name, &[], *value);
    }
}

/// The listeners' gauges and refusals, one series per listener (and reason).
fn render_listeners(out: &mut String, extra: &Extra) {
    if extra.listeners.is_empty() {
        return;
    }
    let families: [Family<ListenerGauges>; 3] = [
        (
            "sluice_listener_connections",
            "gauge",
            "Open connections (capped by SLUICE_MAX_CONNECTIONS).",
            |l| l.connections,
        ),
        (
            "sluice_listener_inflight_requests",
            "gauge",
            "Requests being served (capped by SLUICE_MAX_INFLIGHT_REQUESTS).",
            |l| l.inflight_requests,
        ),
        (
            "sluice_listener_idle_closed_total",
            "counter",
            "Connections closed after SLUICE_IDLE_TIMEOUT_SECS without a request.",
            |l| l.idle_closed,
        ),
    ];
    per_item(out, &families, &extra.listeners, |l| ("port", l.port));
    let name = "sluice_listener_refused_total";
    header(
        out,
        name,
        "counter",
        "Requests refused by a listener limit: inflight (SLUICE_MAX_INFLIGHT_REQUESTS), deadline \
         (SLUICE_REQUEST_TIMEOUT_MS), message_size (SLUICE_MAX_REQUEST_BYTES), pending_bytes \
         (SLUICE_MAX_PENDING_REQUEST_BYTES).",
    );
    for l in &extra.listeners {
        for (reason, n) in l.refused {
            sample(out, name, &[("port", l.port), ("reason", reason)], n);
        }
    }
    let name = "sluice_listener_pending_request_bytes";
    header(
        out,
        name,
        "gauge",
        "gRPC message bytes being received (capped by SLUICE_MAX_PENDING_REQUEST_BYTES).",
    );
    sample(out, name, &[], extra.pending_request_bytes);
}

/// A backend's breaker series: the metric prefix, the label naming each breaker, the backend.
struct BreakerSeries {
    prefix: &'static str,
    label: &'static str,
    noun: &'static str,
}

const REDIS_BREAKERS: BreakerSeries = BreakerSeries {
    prefix: "sluice_redis",
    label: "target",
    noun: "Redis",
};

const MEMCACHE_BREAKERS: BreakerSeries = BreakerSeries {
    prefix: "sluice_memcache",
    label: "server",
    noun: "memcached",
};

/// A backend's breakers, one series per Redis (or memcached server).
fn breakers(out: &mut String, series: BreakerSeries, breakers: &[BreakerGauges]) {
    if breakers.is_empty() {
        return;
    }
    let BreakerSeries {
        prefix,
        label,
        noun,
    } = series;
    let families: [NamedFamily<BreakerGauges>; 3] = [
        (
            format!("{prefix}_up"),
            "gauge",
            format!(
                "1 while {noun} answers; 0 while it is down (calls fail at once) or not connected yet."
            ),
            |b| u64::from(b.up),
        ),
        (
            format!("{prefix}_breaker_opens_total"),
            "counter",
            format!("Times {noun} was found down and calls started failing at once."),
            |b| b.opens,
        ),
        (
            format!("{prefix}_fast_failures_total"),
            "counter",
            format!(
                "Calls answered at once, without {noun}, because it was down or not connected yet."
            ),
            |b| b.fast_failures,
        ),
    ];
    for (name, kind, help, value) in &families {
        header(out, name, kind, help);
        for b in breakers {
            sample(out, name, &[(label, b.target.as_str())], value(b));
        }
    }
}

/// A family of series: its name, type, help, and how to read an item's value.
type Family<T> = (&'static str, &'static str, &'static str, fn(&T) -> u64);

/// A [`Family`] whose name and help are made at run time.
type NamedFamily<T> = (String, &'static str, String, fn(&T) -> u64);

/// Each family, with one sample per item, labelled by `label` (a listener's port, a Redis).
fn per_item<T>(
    out: &mut String,
    families: &[Family<T>],
    items: &[T],
    label: impl Fn(&T) -> (&'static str, &str),
) {
    for (name, kind, help, value) in families {
        header(out, name, kind, help);
        for item in items {
            sample(out, name, &[label(item)], value(item));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::stats::{Outcome, StatsOptions};

    /// A node deciding alone shows it: majority 0 and the hits it decided so.
    #[test]
    fn the_cluster_series_say_when_a_node_decides_alone() {
        let mut out = String::new();
        let alone = ClusterGauges {
            alone_hits: 7,
            majority: false,
            ..ClusterGauges::default()
        };
        render_cluster(&mut out, &alone);
        assert!(out.contains("\nsluice_cluster_majority 0\n"), "{out}");
        assert!(
            out.contains("\nsluice_cluster_alone_hits_total 7\n"),
            "{out}"
        );
        out.clear();
        render_cluster(
            &mut out,
            &ClusterGauges {
                majority: true,
                ..alone
            },
        );
        assert!(out.contains("\nsluice_cluster_majority 1\n"), "{out}");
    }

    fn hit(stats: &Stats, key: &str) {
        stats.record_dynamic(
            key,
            crate::telemetry::stats::KeySource::Limit(key),
            &Outcome::admitted(1, 10),
        );
    }

    #[test]
    fn keys_split_into_domain_key1_key2_and_deeper_levels_add_up() {
        let stats = Stats::new(StatsOptions::default());
        hit(&stats, "domain1.key1_val1");
        hit(&stats, "domain1.key3_val3.key4_val4");
        hit(&stats, "domain1.key3_val3.key4_val4.key5_val5");
        hit(&stats, "d.ip_10.0.0.1");
        let text = render(&stats, &Extra::default());
        assert!(
            text.contains(
                "ratelimit_service_rate_limit_total_hits{domain=\"domain1\",key1=\"key1_val1\"} 1\n"
            ),
            "{text}"
        );
        assert!(text.contains(
            "ratelimit_service_rate_limit_total_hits{domain=\"domain1\",key1=\"key3_val3\",key2=\"key4_val4\"} 2\n"
        ));
        assert!(text.contains(
            "ratelimit_service_rate_limit_within_limit{domain=\"d\",key1=\"ip_10_0_0_1\"} 1\n"
        ));
    }

    /// The lines of `text` for the stats key `d.k`.
    fn series_of_key(text: &str) -> Vec<&str> {
        text.lines()
            .filter(|l| l.contains(r#"{domain="d",key1="k""#))
            .map(|l| l.split_once('{').unwrap().0)
            .collect()
    }

    /// Go's six from the first record; the refund pair once a refund arrived; the slot
    /// counters and the slots held once a slot moved (a concurrency limit's).
    #[test]
    fn a_series_shows_the_stats_that_apply_to_it() {
        let stats = Stats::new(StatsOptions::default());
        hit(&stats, "d.k");
        let text = render(&stats, &Extra::default());
        assert_eq!(series_of_key(&text).len(), 6, "{text}");
        let mut refund = Outcome::admitted(1, 10);
        refund.negative = true;
        let record = |o: &Outcome| {
            stats.record_dynamic("d.k", crate::telemetry::stats::KeySource::Limit("d.k"), o);
        };
        record(&refund);
        let text = render(&stats, &Extra::default());
        let names = series_of_key(&text);
        assert_eq!(names.len(), 8, "{text}");
        assert!(names.contains(&"ratelimit_service_rate_limit_negative_hits_ignored"));
        let mut start = Outcome::admitted(1, 10);
        start.slots.taken = 1;
        record(&start);
        let text = render(&stats, &Extra::default());
        let names = series_of_key(&text);
        assert_eq!(names.len(), 12, "{text}");
        assert!(names.contains(&"ratelimit_service_rate_limit_slots_expired"));
        assert!(text.contains("sluice_rate_limit_slots_held{domain=\"d\",key1=\"k\"} 1\n"));
    }

    #[test]
    fn the_response_time_is_in_milliseconds_when_asked() {
        let at = |millis: bool| {
            let stats = Stats::new(StatsOptions {
                response_time_in_millis: millis,
                ..StatsOptions::default()
            });
            stats.request_done(std::time::Duration::from_micros(1500), None);
            render(&stats, &Extra::default())
        };
        let seconds = at(false);
        assert!(seconds.contains(r#"ratelimit_service_response_time_seconds_bucket{grpc_method="ShouldRateLimit",le="0.0025"} 1"#), "{seconds}");
        assert!(seconds.contains(r#"ratelimit_service_response_time_seconds_sum{grpc_method="ShouldRateLimit"} 0.0015"#), "{seconds}");
        let millis = at(true);
        assert!(millis.contains(r#"ratelimit_service_response_time_seconds_bucket{grpc_method="ShouldRateLimit",le="2.5"} 1
"#), "{millis}");
        assert!(millis.contains(r#"ratelimit_service_response_time_seconds_bucket{grpc_method="ShouldRateLimit",le="1"} 0"#), "{millis}");
        assert!(
            millis.contains(
                r#"ratelimit_service_response_time_seconds_sum{grpc_method="ShouldRateLimit"} 1.5"#
            ),
            "{millis}"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let mut out = String::new();
        sample(&mut out, "m", &[("l", "a\"b\\c\nd")], 1);
        assert_eq!(out, "m{l=\"a\\\"b\\\\c\\nd\"} 1\n");
    }
}
