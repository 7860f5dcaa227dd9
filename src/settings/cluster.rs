//! The peer cluster (PEERS, PEERS_DNS, PEER_*, SLUICE_CLUSTER_MODE, SLUICE_PEER_*) into
//! [`ClusterConfig`], with its write-behind to Redis checked against the other settings.

use std::net::SocketAddr;
use std::time::Duration;

use super::redis::RedisArgs;
use super::{SettingsError, invalid};
use crate::cluster::{ClusterConfig, ClusterMode, PeerSource, WriteBehind};

#[allow(clippy::too_many_arguments)]
pub(super) fn cluster_settings(
    peers: &str,
    peers_dns: Option<&str>,
    peer_port: u16,
    advertise: Option<&str>,
    mode: &str,
    timeout_ms: u64,
    batch_window_us: u64,
) -> Result<Option<ClusterConfig>, SettingsError> {
    let list: Vec<String> = peers
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect();
    let source = match (list.is_empty(), peers_dns.filter(|d| !d.is_empty())) {
        (true, None) => return Ok(None),
        (false, Some(_)) => {
            return Err(invalid("PEERS", peers, "set PEERS or PEERS_DNS, not both"));
        }
        (false, None) => {
            for p in &list {
                let ok = p
                    .rsplit_once(':')
                    .is_some_and(|(h, port)| !h.is_empty() && port.parse::<u16>().is_ok());
                if !ok {
                    return Err(invalid("PEERS", p, "expected host:port"));
                }
            }
            PeerSource::Static(list)
        }
        (true, Some(name)) => PeerSource::Dns {
            name: name.to_owned(),
            port: peer_port,
        },
    };
    let advertise = match advertise.filter(|a| !a.is_empty()) {
        Some(a) => a.to_owned(),
        None => {
            let host = std::fs::read_to_string("/etc/hostname")
                .map(|h| h.trim().to_owned())
                .unwrap_or_else(|_| "localhost".into());
            format!("{host}:{peer_port}")
        }
    };
    if let PeerSource::Static(list) = &source
        && !list.contains(&advertise)
    {
        return Err(invalid(
            "PEER_ADVERTISE_ADDRESS",
            &advertise,
            "must be one of PEERS (how the other peers reach this node)",
        ));
    }
    let mode = match mode.to_ascii_lowercase().as_str() {
        "forward" => ClusterMode::Forward,
        "divided" => ClusterMode::Divided,
        _ => {
            return Err(invalid(
                "SLUICE_CLUSTER_MODE",
                mode,
                "expected forward or divided",
            ));
        }
    };
    if timeout_ms == 0 {
        return Err(invalid("SLUICE_PEER_TIMEOUT_MS", 0, "must be at least 1"));
    }
    Ok(Some(ClusterConfig {
        peers: source,
        advertise,
        listen: SocketAddr::from(([0, 0, 0, 0], peer_port)),
        mode,
        timeout: Duration::from_millis(timeout_ms),
        batch_window: Duration::from_micros(batch_window_us),
        write_behind: None,
    }))
}

/// SLUICE_PEER_WRITE_BEHIND: checked against the other settings before any port is bound.
/// The Redis connection settings are REDIS_URL's own, so one Redis setup serves either use.
pub(super) fn write_behind(
    enabled: bool,
    interval_ms: u64,
    backend_type: Option<&str>,
    redis: &RedisArgs,
    cluster: Option<&ClusterConfig>,
    key_prefix: &str,
) -> Result<Option<WriteBehind>, SettingsError> {
    const VAR: &str = "SLUICE_PEER_WRITE_BEHIND";
    if !enabled {
        return Ok(None);
    }
    let Some(cluster) = cluster else {
        return Err(invalid(
            VAR,
            true,
            "needs PEERS or PEERS_DNS: it makes the peer cluster's counters durable",
        ));
    };
    if cluster.mode == ClusterMode::Divided {
        return Err(invalid(
            VAR,
            true,
            "needs SLUICE_CLUSTER_MODE=forward: in divided mode no node owns a counter, so \
             there is nothing to take over",
        ));
    }
    if let Some(kind) = backend_type.filter(|b| !b.eq_ignore_ascii_case("memory")) {
        return Err(invalid(
            "BACKEND_TYPE",
            kind,
            "with SLUICE_PEER_WRITE_BEHIND=true the peer cluster counts in memory and Redis \
             keeps only a copy; unset BACKEND_TYPE or set it to memory",
        ));
    }
    if redis.redis_url.as_deref().is_none_or(str::is_empty) {
        return Err(invalid(
            "REDIS_URL",
            "",
            "required by SLUICE_PEER_WRITE_BEHIND=true (where counters are written behind)",
        ));
    }
    if redis.redis_persecond {
        return Err(invalid(
            "REDIS_PERSECOND",
            true,
            "the write-behind copy goes to REDIS_URL only; unset REDIS_PERSECOND",
        ));
    }
    if !(10..=60_000).contains(&interval_ms) {
        return Err(invalid(
            "SLUICE_PEER_WRITE_BEHIND_MS",
            interval_ms,
            "must be between 10 and 60000",
        ));
    }
    Ok(Some(WriteBehind {
        redis: redis.clone().validate()?,
        interval: Duration::from_millis(interval_ms),
        key_prefix: key_prefix.to_owned(),
    }))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{error, settings};
    use super::super::*;

    #[test]
    fn write_behind_needs_forward_peers_and_redis_url_and_keeps_counters_in_memory() {
        let peers = ["--peers", "a:1,b:1", "--peer-advertise-address", "a:1"];
        fn with<'a>(peers: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
            [peers, extra].concat()
        }
        // The refusal for write-behind on the peers above with REDIS_URL=x:1 and `extra`.
        let on_peers_with_redis = |extra: &[&str]| {
            let on = ["--peer-write-behind", "--redis-url", "x:1"];
            error(&with(&peers, &[&on[..], extra].concat()))
        };
        let s = settings(&with(
            &peers,
            &[
                "--peer-write-behind",
                "--redis-socket-type",
                "tcp",
                "--redis-url",
                "127.0.0.1:6379",
                "--cache-key-prefix",
                "app:",
            ],
        ))
        .unwrap();
        // REDIS_URL here is where counters are copied, not the backend.
        assert_eq!(s.app.backend, Backend::Memory);
        let wb = s.app.cluster.unwrap().write_behind.unwrap();
        assert_eq!(
            wb.redis.main.urls,
            vec!["redis://127.0.0.1:6379".to_string()]
        );
        assert_eq!(wb.interval, Duration::from_millis(500));
        assert_eq!(wb.key_prefix, "app:");
        // Off by default.
        assert_eq!(
            settings(&with(&peers, &[]))
                .unwrap()
                .app
                .cluster
                .unwrap()
                .write_behind,
            None
        );

        let err = error(&["--peer-write-behind", "--redis-url", "x:1"]);
        assert!(
            err.starts_with("SLUICE_PEER_WRITE_BEHIND=true: needs PEERS"),
            "{err}"
        );
        let err = error(&with(&peers, &["--peer-write-behind"]));
        assert!(
            err.starts_with("REDIS_URL=: required by SLUICE_PEER_WRITE_BEHIND"),
            "{err}"
        );
        let err = on_peers_with_redis(&["--cluster-mode", "divided"]);
        assert!(err.contains("SLUICE_CLUSTER_MODE=forward"), "{err}");
        let err = on_peers_with_redis(&["--backend-type", "redis"]);
        assert!(err.starts_with("BACKEND_TYPE=redis: "), "{err}");
        let err = on_peers_with_redis(&["--peer-write-behind-ms", "0"]);
        assert!(err.starts_with("SLUICE_PEER_WRITE_BEHIND_MS=0: "), "{err}");
        let err = on_peers_with_redis(&["--redis-persecond"]);
        assert!(err.starts_with("REDIS_PERSECOND=true: "), "{err}");
        // The Redis settings are checked as for the backend.
        let err = on_peers_with_redis(&["--redis-timeout", "soon"]);
        assert!(err.starts_with("REDIS_TIMEOUT=soon"), "{err}");
        // Without write-behind, Redis and peers are alternatives.
        let err = error(&with(&peers, &["--redis-url", "x:1"]));
        assert!(
            err.starts_with("PEERS=a:1,b:1: the Redis backend")
                && err.contains("SLUICE_PEER_WRITE_BEHIND"),
            "{err}"
        );
        let err = error(&[
            "--peers-dns",
            "sluice.ns",
            "--backend-type",
            "redis",
            "--redis-url",
            "x:1",
        ]);
        assert!(err.starts_with("PEERS_DNS=sluice.ns: "), "{err}");
    }
}
