//! The status page on the debug port (`/`): server-rendered HTML that works without JavaScript
//! and refreshes itself every [`REFRESH_SECS`] seconds. What Sluice is doing now: calls per
//! second (since the page was last rendered), the keys closest to or over their limits
//! ([`crate::service::HotKeys`]), the concurrency limits' slots, the counter store and its
//! backends, the peers and lease mode, and the loaded limits (the `/rlconfig` lines, at most [`MAX_LIMIT_LINES`]).

use std::fmt::Write;

use super::state::DebugState;
use crate::clock::Timestamp;
use crate::cluster::lease::parent::Source;
use crate::telemetry::prometheus::ParentGauges;
use crate::telemetry::prometheus::StoreReport;

/// How often the page reloads itself, in seconds.
pub(crate) const REFRESH_SECS: u32 = 5;
/// The most `/rlconfig` lines the page shows (all are on `/rlconfig`).
pub(crate) const MAX_LIMIT_LINES: usize = 200;

/// Escapes text for HTML.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page at `now`.
#[allow(clippy::cast_precision_loss, reason = "ratios for display")]
pub(crate) fn render(st: &DebugState, now: Timestamp) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"{REFRESH_SECS}\">\
         <title>Sluice status</title><style>body{{font-family:sans-serif;margin:1.5em}}\
         table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:2px 8px;\
         text-align:left}}.over{{color:#b00;font-weight:bold}}.down{{color:#b00;font-weight:bold}}\
         .up{{color:#070}}</style></head><body><h1>Sluice {}</h1>",
        esc(env!("CARGO_PKG_VERSION"))
    );
    traffic(&mut out, st, now);
    hot_keys(&mut out, st, now);
    slots(&mut out, st);
    penalties(&mut out, st);
    let report = st.store.report();
    store(&mut out, &report);
    peers(&mut out, &report);
    limits(&mut out, st);
    out.push_str(
        "<p>Also on this port: <a href=\"/rlconfig\">/rlconfig</a>, <a href=\"/metrics\">/metrics</a>, \
         <a href=\"/stats\">/stats</a>, /debug/counters and /debug/explain \
         (docs/operations.md).</p></body></html>\n",
    );
    out
}

fn traffic(out: &mut String, st: &DebugState, now: Timestamp) {
    let total = st.stats.service.total_requests.get();
    let rate = st.calls.per_second(now, total);
    let _ = write!(
        out,
        "<h2>Traffic</h2><p id=\"calls\">{total} ShouldRateLimit calls since start; {}</p>",
        rate.map_or(
            "calls per second at the next refresh".to_owned(),
            |r| format!("{r:.1} per second over the last {REFRESH_SECS} s or so")
        )
    );
}

fn hot_keys(out: &mut String, st: &DebugState, now: Timestamp) {
    out.push_str("<h2>Keys closest to or over their limits</h2>");
    let hot = st.hot.snapshot(now);
    if hot.is_empty() {
        out.push_str("<p id=\"hot-keys\">None at 80% of its limit or more.</p>");
        return;
    }
    out.push_str(
        "<table id=\"hot-keys\"><tr><th>counter key</th><th>limit</th><th>count</th>\
         <th>state</th><th>resets in</th><th>lease (lease mode)</th></tr>",
    );
    for h in hot {
        let q = &h.quota;
        let _ = write!(
            out,
            "<tr class=\"{}\"><td>{}</td><td>{} per {} ({})</td><td>{}</td><td>{}</td><td>{} s</td><td>{}</td></tr>",
            if h.over { "over" } else { "near" },
            esc(&h.key),
            q.requests_per_unit,
            if q.unit_multiplier > 1 {
                format!("{} {}", q.unit_multiplier, q.unit.name())
            } else {
                q.unit.name().to_owned()
            },
            q.algorithm.name(),
            h.count,
            if h.penalized {
                "PENALTY".to_owned()
            } else if h.over {
                "OVER".to_owned()
            } else {
                format!("{:.0}%", h.fullness * 100.0)
            },
            h.until
                .micros()
                .saturating_sub(now.micros())
                .div_ceil(1_000_000),
            lease_text(st, &h.key),
        );
    }
    out.push_str("</table>");
}

/// The concurrency limits that took a slot: held (by this node's calls: taken less given back
/// less expired), given back, and expired without a refund (each a lost refund).
fn slots(out: &mut String, st: &DebugState) {
    let series = crate::telemetry::prometheus::limit_series(&st.stats);
    let mut rows = series.iter().filter(|(_, v)| v[8] > 0).peekable();
    if rows.peek().is_none() {
        return;
    }
    out.push_str(
        "<h2>Concurrency limits</h2><table id=\"slots\"><tr><th>limit</th><th>slots held</th>\
         <th>given back</th><th>expired without a refund</th></tr>",
    );
    for (labels, v) in rows {
        let held = crate::telemetry::stats::LimitCounters::slots_held(v);
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{held}</td><td>{}</td><td>{}</td></tr>",
            esc(&series_name(labels)),
            v[9],
            v[10]
        );
    }
    out.push_str("</table>");
}

/// A per-limit series' name: its domain and keys, joined by dots.
fn series_name((domain, key1, key2): &crate::telemetry::limits::LabelSet) -> String {
    let parts = [Some(domain), key1.as_ref(), key2.as_ref()];
    let parts: Vec<&str> = parts.into_iter().flatten().map(String::as_str).collect();
    parts.join(".")
}

/// The limits with a penalty that started one (`penalty_seconds`): penalties started and
/// hits they refused, by this node's calls.
fn penalties(out: &mut String, st: &DebugState) {
    use crate::telemetry::stats::LimitCounters;
    let series = crate::telemetry::prometheus::limit_series(&st.stats);
    let started = LimitCounters::NAMES.len() - 2;
    let mut rows = series.iter().filter(|(_, v)| v[started] > 0).peekable();
    if rows.peek().is_none() {
        return;
    }
    out.push_str(
        "<h2>Penalties</h2><table id=\"penalties\"><tr><th>limit</th><th>penalties started</th>\
         <th>hits refused by a penalty</th></tr>",
    );
    for (labels, v) in rows {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&series_name(labels)),
            v[started],
            v[started + 1]
        );
    }
    out.push_str("</table>");
}

/// What this node holds of `key`'s lease, and how many nodes hold one when it is the owner;
/// empty outside lease mode.
fn lease_text(st: &DebugState, key: &str) -> String {
    let Some(view) = st.store.lease(key) else {
        return String::new();
    };
    let mut text = match view.held {
        Some(h) => format!("holds {} ({} used)", h.allowance, h.used),
        None => "holds none".to_owned(),
    };
    if view.owner == view.node {
        let _ = write!(text, "; owner, {} holders", view.holders.len());
    } else {
        let _ = write!(text, "; owner {}", view.owner);
    }
    if let Some(p) = &view.parent {
        let _ = match p.source {
            Source::Parent => write!(
                text,
                "; parent {} granted {} ({} clusters)",
                p.parent, p.allowance, p.children
            ),
            Source::Waiting => write!(text, "; parent {} (waiting for its grant)", p.parent),
            Source::Safe => write!(
                text,
                "; parent unreachable: safe capacity {} per window",
                p.safe_capacity
            ),
        };
    }
    esc(&text)
}

#[allow(clippy::cast_precision_loss, reason = "ratios for display")]
fn store(out: &mut String, report: &StoreReport) {
    out.push_str("<h2>Counter store</h2><ul id=\"store\">");
    if let Some(m) = report.memory {
        let _ = write!(
            out,
            "<li>memory: {} of {} counters ({:.0}%), {} of {} bytes; {} requests refused because it was full</li>",
            m.live_counters,
            m.max_counters,
            m.live_counters as f64 * 100.0 / m.max_counters.max(1) as f64,
            m.counter_bytes,
            m.max_counter_bytes,
            m.rejected_full
        );
    }
    let redis = report.redis.iter().map(|r| ("Redis", r));
    let memcache = report.memcache.iter().map(|m| ("memcached", m));
    for (noun, r) in redis.chain(memcache) {
        let _ = write!(
            out,
            "<li>{noun} {}: <span class=\"{}\">{}</span> (found down {} times)</li>",
            esc(&r.target),
            if r.up { "up" } else { "down" },
            if r.up { "up" } else { "DOWN" },
            r.opens
        );
    }
    out.push_str("</ul>");
}

fn peers(out: &mut String, report: &StoreReport) {
    let Some(c) = &report.cluster else {
        return;
    };
    out.push_str("<h2>Peers</h2><table id=\"peers\"><tr><th>peer</th><th>state</th></tr>");
    for (addr, up) in &c.peers {
        let _ = write!(
            out,
            "<tr class=\"{0}\"><td>{1}</td><td>{2}</td></tr>",
            if *up { "up" } else { "down" },
            esc(addr),
            if *up { "up" } else { "DOWN" }
        );
    }
    let _ = write!(
        out,
        "</table><p>{} hits counted here as owner, {} forwarded, {} forwards failed.</p>",
        c.local_hits, c.forwarded_hits, c.failed_forwards
    );
    if let Some(p) = &c.parent {
        let (down, text) = parent_text(p);
        let _ = write!(
            out,
            "<p id=\"parent\" class=\"{}\">{}</p>",
            if down { "down" } else { "up" },
            esc(&text)
        );
    }
    if !c.lease.is_empty() {
        out.push_str("<p id=\"leases\">Lease mode: ");
        let parts: Vec<String> = c.lease.iter().map(|(n, v)| format!("{n} {v}")).collect();
        out.push_str(&esc(&parts.join(", ")));
        out.push_str(" (one key's leases: /debug/lease?key=...).</p>");
    }
}

/// The lease parent's state (SLUICE_LEASE_PARENT), and whether it is bad news: a parent never
/// reached or unreachable leaves each limit its safe capacity per window.
fn parent_text(p: &ParentGauges) -> (bool, String) {
    let safe = if p.expected {
        format!(
            "the limit / {} (SLUICE_LEASE_PARENT_EXPECTED_CLUSTERS)",
            p.clusters
        )
    } else {
        format!(
            "the limit / {} (the clusters the parent counted)",
            p.clusters
        )
    };
    let text = if !p.reached {
        format!(
            "Lease parent {}: PARENT NEVER REACHED since start: deciding from safe capacity \
             {safe} per window, or each limit's YAML safe_capacity.",
            p.peers
        )
    } else if p.unreachable {
        format!(
            "Lease parent {}: PARENT UNREACHABLE: the last grants while they hold, then \
             deciding from safe capacity {safe} per window, or each limit's YAML \
             safe_capacity.",
            p.peers
        )
    } else {
        return (
            false,
            format!(
                "Lease parent {}: answering; {} child clusters counted.",
                p.peers, p.clusters
            ),
        );
    };
    (true, text)
}

fn limits(out: &mut String, st: &DebugState) {
    let dump = st.config.current().map(|c| c.dump()).unwrap_or_default();
    let count = dump.lines().count();
    let _ = write!(out, "<h2>Loaded limits ({count})</h2><pre id=\"limits\">");
    for line in dump.lines().take(MAX_LIMIT_LINES) {
        out.push_str(&esc(line));
        out.push('\n');
    }
    if count > MAX_LIMIT_LINES {
        let _ = writeln!(out, "... {} more on /rlconfig", count - MAX_LIMIT_LINES);
    }
    out.push_str("</pre>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::state::CallRate;

    #[test]
    fn text_is_escaped_and_the_rate_is_measured_between_renderings() {
        assert_eq!(
            esc("<a href='x'>&\"</a>"),
            "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;"
        );
        let rate = CallRate::default();
        assert_eq!(rate.per_second(Timestamp::from_secs(10), 100), None);
        assert_eq!(rate.per_second(Timestamp::from_secs(15), 150), Some(10.0));
    }

    #[test]
    fn a_parent_never_reached_or_unreachable_is_said_loudly_with_the_safe_capacity() {
        let never = ParentGauges {
            peers: "r1:8082".to_owned(),
            reached: false,
            unreachable: true,
            clusters: 3,
            expected: true,
        };
        let (down, text) = parent_text(&never);
        assert!(down, "{text}");
        assert!(
            text.contains(
                "PARENT NEVER REACHED since start: deciding from safe capacity the limit / 3 \
                 (SLUICE_LEASE_PARENT_EXPECTED_CLUSTERS) per window"
            ),
            "{text}"
        );
        let lost = ParentGauges {
            reached: true,
            expected: false,
            ..never.clone()
        };
        let (down, text) = parent_text(&lost);
        assert!(down && text.contains("PARENT UNREACHABLE"), "{text}");
        assert!(text.contains("the limit / 3 (the clusters the parent counted)"));
        let (down, text) = parent_text(&ParentGauges {
            unreachable: false,
            ..lost
        });
        assert!(!down, "{text}");
    }
}
