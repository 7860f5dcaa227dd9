//! statsd: every STATS_FLUSH_INTERVAL, the counters' increases since the last flush are sent as
//! `name:delta|c` lines over UDP, under the Go service's statsd names
//! (`ratelimit.service.rate_limit.<key>.<stat>`, `ratelimit.service.call.should_rate_limit.*`,
//! `ratelimit_server.ShouldRateLimit.total_requests`, `ratelimit.service.config_load_*`,
//! `ratelimit.service.global_shadow_mode`), and every flush the configured limit of each stats
//! key as gauges (`ratelimit.service.rate_limit.<key>.rate_limit`, the name of
//! envoyproxy/ratelimit's unmerged PR #1138, and `.window_seconds`). Off by default
//! (USE_STATSD).
//!
//! The Go service sends over TCP through gostats; Sluice sends UDP datagrams of at most
//! [`MAX_DATAGRAM`] bytes, which statsd and statsd_exporter accept by default. The latency
//! histogram is not sent: statsd timers need every sample, which Sluice does not keep.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use tokio::net::UdpSocket;

use super::limits::entry_limit;
use super::prometheus::Extra;
use super::stats::{LimitCounters, Stats};

/// Fits a typical 1500-byte MTU with room for IP and UDP headers.
pub(crate) const MAX_DATAGRAM: usize = 1432;

/// Every counter under its statsd name, summed when several keys share a name.
pub fn counters(stats: &Stats, extra: &Extra) -> HashMap<String, u64> {
    let mut out: HashMap<String, u64> = HashMap::new();
    for entry in stats.entries() {
        for (stat, v) in LimitCounters::NAMES.iter().zip(entry.counters.values()) {
            *out.entry(format!(
                "ratelimit.service.rate_limit.{}.{stat}",
                entry.name
            ))
            .or_default() += v;
        }
    }
    for (domain, n) in stats.domains_not_found() {
        *out.entry(format!(
            "ratelimit.service.rate_limit.{domain}.domain_not_found"
        ))
        .or_default() += n;
    }
    let svc = &stats.service;
    for (name, v) in [
        (
            "ratelimit.service.call.should_rate_limit.redis_error",
            svc.redis_error.load(Ordering::Relaxed),
        ),
        (
            "ratelimit.service.call.should_rate_limit.service_error",
            svc.service_error.load(Ordering::Relaxed),
        ),
        (
            "ratelimit_server.ShouldRateLimit.total_requests",
            svc.total_requests.get(),
        ),
        (
            "ratelimit.service.global_shadow_mode",
            svc.global_shadow_mode.load(Ordering::Relaxed),
        ),
        (
            "sluice.reservations.opened",
            svc.reservations_opened.load(Ordering::Relaxed),
        ),
        (
            "sluice.reservations.settled",
            svc.reservations_settled.load(Ordering::Relaxed),
        ),
        (
            "sluice.reservations.settled_late",
            svc.reservations_settled_late.load(Ordering::Relaxed),
        ),
        (
            "ratelimit.service.config_load_success",
            extra.config_load_success,
        ),
        (
            "ratelimit.service.config_load_error",
            extra.config_load_error,
        ),
    ] {
        out.insert(name.to_owned(), v);
    }
    out
}

/// The configured limit of every stats key that has one, as `name:value|g` lines:
/// `<key>.rate_limit` (requests_per_unit) and `<key>.window_seconds`. Sent at every flush, as
/// gostats sends its gauges, so a statsd that forgets idle gauges keeps them while the limit
/// stands and forgets a limit a reload removed.
pub(crate) fn gauge_lines(stats: &Stats, extra: &Extra) -> Vec<String> {
    let mut lines = Vec::new();
    for entry in stats.entries() {
        let Some((_, shape)) = entry_limit(&entry, &extra.limits) else {
            continue;
        };
        let prefix = format!("ratelimit.service.rate_limit.{}", entry.name);
        lines.push(format!("{prefix}.rate_limit:{}|g", shape.requests_per_unit));
        lines.push(format!("{prefix}.window_seconds:{}|g", shape.window_secs()));
    }
    lines
}

/// Sends counter increases to one statsd server.
pub struct StatsdSink {
    socket: UdpSocket,
    last: HashMap<String, u64>,
}

impl StatsdSink {
    /// Binds an ephemeral local port and connects it to `server`.
    pub async fn connect(server: SocketAddr) -> std::io::Result<Self> {
        let local: SocketAddr = if server.is_ipv4() {
            "0.0.0.0:0".parse().expect("literal address")
        } else {
            "[::]:0".parse().expect("literal address")
        };
        let socket = UdpSocket::bind(local).await?;
        socket.connect(server).await?;
        Ok(StatsdSink {
            socket,
            last: HashMap::new(),
        })
    }

    /// Sends every counter that grew since the last flush, and every limit gauge; returns the
    /// counter lines sent. Counters that did not move are not sent, as gostats does.
    pub async fn flush(&mut self, stats: &Stats, extra: &Extra) -> std::io::Result<usize> {
        let now = counters(stats, extra);
        let mut lines = Vec::new();
        for (name, v) in &now {
            let before = self.last.get(name).copied().unwrap_or(0);
            if *v > before {
                lines.push(format!("{name}:{}|c", v - before));
            }
        }
        lines.sort();
        let sent = lines.len();
        let mut gauges = gauge_lines(stats, extra);
        gauges.sort();
        lines.extend(gauges);
        let mut datagram = String::with_capacity(MAX_DATAGRAM);
        for line in &lines {
            if !datagram.is_empty() && datagram.len() + 1 + line.len() > MAX_DATAGRAM {
                self.socket.send(datagram.as_bytes()).await?;
                datagram.clear();
            }
            if !datagram.is_empty() {
                datagram.push('\n');
            }
            datagram.push_str(line);
        }
        if !datagram.is_empty() {
            self.socket.send(datagram.as_bytes()).await?;
        }
        self.last = now;
        Ok(sent)
    }
}
