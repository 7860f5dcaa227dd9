//! The peer cluster (PEERS, PEERS_DNS, PEER_*, SLUICE_CLUSTER_MODE, SLUICE_PEER_*) into
//! [`ClusterConfig`], with its write-behind to Redis checked against the other settings.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use clap::ArgAction;

use super::parse::{MIB, in_range, parse_go_bool, table_bytes};
use super::redis::RedisArgs;
use super::{SettingsError, invalid};
use crate::app::Backend;
use crate::cluster::lease::LeaseTiming;
use crate::cluster::lease::parent::ParentTiming;
use crate::cluster::{ClusterConfig, ClusterMode, ParentConfig, PeerSource, WriteBehind};

/// The peer cluster's settings, raw.
#[derive(Clone, Debug, clap::Args)]
pub struct ClusterArgs {
    /// Comma-separated `host:port` peer addresses (every node, this one included): counters are
    /// then owned by one peer each, by rendezvous hashing. Unset: a single node.
    #[arg(long, env = "PEERS", default_value = "", help_heading = "Peer cluster")]
    pub peers: String,
    /// A DNS name whose A/AAAA records are the peers (a Kubernetes headless Service), on
    /// PEER_PORT; re-resolved every 5 s.
    #[arg(long, env = "PEERS_DNS", help_heading = "Peer cluster")]
    pub peers_dns: Option<String>,
    /// Port of the peer listener (the internal gRPC service peers forward hits to).
    #[arg(
        long,
        env = "PEER_PORT",
        default_value_t = 8082,
        help_heading = "Peer cluster"
    )]
    pub peer_port: u16,
    /// How this node appears among the peers (`host:port`). Default: the HOST-independent
    /// `<hostname>:PEER_PORT`; must be one of PEERS when PEERS is set.
    #[arg(long, env = "PEER_ADVERTISE_ADDRESS", help_heading = "Peer cluster")]
    pub peer_advertise_address: Option<String>,
    /// `forward`: each counter lives on its owner, others forward hits to it (exact global
    /// limits while peer links are healthy and across joins; up to twice a limit where a key's
    /// owner is lost). `divided`: each node enforces limit / healthy peers locally, with no network
    /// on the request path (Cortex's global limiter). `lease`: each key's owner leases shares
    /// of its capacity to the nodes, which decide locally (docs/cluster.md).
    #[arg(
        long,
        env = "SLUICE_CLUSTER_MODE",
        default_value = "forward",
        help_heading = "Peer cluster"
    )]
    pub cluster_mode: String,
    /// Deadline of a forwarded call, in milliseconds; a peer that misses it is marked down.
    #[arg(
        long,
        env = "SLUICE_PEER_TIMEOUT_MS",
        default_value_t = 200,
        help_heading = "Peer cluster"
    )]
    pub peer_timeout_ms: u64,
    /// How long a call in flight to a peer gathers the forwards behind it, in microseconds: a
    /// forward with no call in flight to its peer leaves at once; one behind a call waits for
    /// a call to come back, or until the newest has been out this long (0: never waits).
    #[arg(
        long,
        env = "SLUICE_PEER_BATCH_WINDOW_US",
        default_value_t = 200,
        help_heading = "Peer cluster"
    )]
    pub peer_batch_window_us: u64,
    /// Peer cluster durability: owners write their counters behind to the Redis of REDIS_URL
    /// (and its REDIS_TYPE, REDIS_AUTH, REDIS_TIMEOUT, ...), and a key's new owner loads the
    /// count from there, so losing or restarting a node does not reset its keys. Needs PEERS
    /// or PEERS_DNS in forward mode; counters stay in memory (BACKEND_TYPE must not be redis).
    #[arg(
        long,
        env = "SLUICE_PEER_WRITE_BEHIND",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Peer cluster"
    )]
    pub peer_write_behind: bool,
    /// How often owners write the counters that changed behind to Redis, in milliseconds.
    #[arg(
        long,
        env = "SLUICE_PEER_WRITE_BEHIND_MS",
        default_value_t = 500,
        help_heading = "Peer cluster"
    )]
    pub peer_write_behind_ms: u64,
    /// Lease mode: how often each node renews the leases it holds, in milliseconds (10 to
    /// 10000).
    #[arg(
        long,
        env = "SLUICE_LEASE_RENEW_MS",
        default_value_t = 100,
        help_heading = "Peer cluster"
    )]
    pub lease_renew_ms: u64,
    /// Lease mode: how long a bucket lease, and a node's claim on the owner's fair share,
    /// lasts without renewal, in milliseconds; at least twice SLUICE_LEASE_RENEW_MS, at most
    /// 600000. Also how long an owner caps grants while it rebuilds after a ring change.
    #[arg(
        long,
        env = "SLUICE_LEASE_DURATION_MS",
        default_value_t = 1000,
        help_heading = "Peer cluster"
    )]
    pub lease_duration_ms: u64,
    /// Lease mode: the memory, in bytes, of each of a node's two lease tables (the leases it
    /// holds, and those it grants as an owner), each entry charged its key plus its measured
    /// overhead (1 MiB to 64 GiB); past it, a key's hits are forwarded to its owner.
    #[arg(
        long,
        env = "SLUICE_LEASE_MAX_BYTES",
        default_value_t = 32 << 20,
        help_heading = "Peer cluster"
    )]
    pub lease_max_bytes: usize,
    /// Lease mode: the part of each fixed window's limit, in percent (0 to 90), that the nodes
    /// together may admit of a key with no lease and no call, each node its equal part (free
    /// shares, docs/cluster.md): keys far below their limit cost no peer call; a key that
    /// passes its part on a node takes a lease, and the owner recalls the key from the other
    /// nodes, which report what they used. 0: off, every key takes a lease at its first hit on
    /// a node.
    #[arg(
        long,
        env = "SLUICE_LEASE_FREE_SHARE_PERCENT",
        default_value_t = 50,
        help_heading = "Peer cluster"
    )]
    pub lease_free_share_percent: u64,
    /// Lease mode: the parent cluster's peers (`host:port,host:port`, as its PEERS lists them),
    /// which this cluster's key owners get each key's capacity from, on behalf of their own
    /// nodes' demand: one limit across clusters (docs/cluster.md, "Regions"). Unset: this
    /// cluster's capacity is the configured limit (a root, or no tree). WARNING: while the
    /// parent has never answered (a restart while it is down, a stale address list), each limit
    /// admits only its YAML safe_capacity, else limit / SLUICE_LEASE_PARENT_EXPECTED_CLUSTERS,
    /// per window in this cluster; logged every minute and shown on the status page.
    #[arg(
        long,
        env = "SLUICE_LEASE_PARENT",
        default_value = "",
        help_heading = "Peer cluster"
    )]
    pub lease_parent: String,
    /// With SLUICE_LEASE_PARENT: how often each key owner renews at the parent, in
    /// milliseconds (SLUICE_LEASE_RENEW_MS to 10000).
    #[arg(
        long,
        env = "SLUICE_LEASE_PARENT_RENEW_MS",
        default_value_t = 200,
        help_heading = "Peer cluster"
    )]
    pub lease_parent_renew_ms: u64,
    /// With SLUICE_LEASE_PARENT: the deadline of a call to the parent, in milliseconds (1 to
    /// 60000); a parent that misses it is tried again after a second, and its keys asked of
    /// the next parent peer. Also how long a key's first request in this cluster may wait for
    /// the parent's grant (then: the safe capacity): keep it above the round trip to the
    /// parent.
    #[arg(
        long,
        env = "SLUICE_LEASE_PARENT_TIMEOUT_MS",
        default_value_t = 1000,
        help_heading = "Peer cluster"
    )]
    pub lease_parent_timeout_ms: u64,
    /// With SLUICE_LEASE_PARENT: how many child clusters the parent has (1 to 1000), this one
    /// included. Before the parent ever answered, a limit without a YAML safe_capacity admits
    /// limit / this per window in this cluster (then: the count the parent reports).
    #[arg(
        long,
        env = "SLUICE_LEASE_PARENT_EXPECTED_CLUSTERS",
        default_value_t = 2,
        help_heading = "Peer cluster"
    )]
    pub lease_parent_expected_clusters: u32,
    /// With SLUICE_LEASE_PARENT: this cluster's name at the parent, the same on each of its
    /// nodes and different in each child cluster (1 to 128 characters, no spaces or commas).
    /// Default with PEERS: a hash of the sorted PEERS; required with PEERS_DNS.
    #[arg(long, env = "SLUICE_LEASE_CLUSTER_NAME", help_heading = "Peer cluster")]
    pub lease_cluster_name: Option<String>,
}

/// A comma-separated list of `host:port` (blank items skipped), or an error naming `var` and
/// the item that is not one.
fn host_ports(var: &'static str, value: &str) -> Result<Vec<String>, SettingsError> {
    let list: Vec<String> = value
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect();
    for p in &list {
        let ok = p
            .rsplit_once(':')
            .is_some_and(|(h, port)| !h.is_empty() && port.parse::<u16>().is_ok());
        if !ok {
            return Err(invalid(var, p, "expected host:port"));
        }
    }
    Ok(list)
}

/// This cluster's name at its parent when SLUICE_LEASE_CLUSTER_NAME is unset: `peers-` and a
/// hash of the sorted PEERS (the same on every node of the cluster).
fn default_cluster_name(peers: &[String]) -> String {
    let mut sorted = peers.to_vec();
    sorted.sort();
    let hash = crate::cluster::ring::key_hash(&sorted.join(","));
    format!("peers-{hash:016x}")
}

impl ClusterArgs {
    /// `None` without PEERS or PEERS_DNS: a single node.
    pub(super) fn validate(&self) -> Result<Option<ClusterConfig>, SettingsError> {
        let Some(source) = self.peer_source()? else {
            if !self.lease_parent.trim().is_empty() {
                return Err(invalid(
                    "SLUICE_LEASE_PARENT",
                    &self.lease_parent,
                    "needs PEERS or PEERS_DNS and SLUICE_CLUSTER_MODE=lease: a parent hands \
                     capacity to a lease cluster's key owners",
                ));
            }
            return Ok(None);
        };
        let advertise = self.advertise();
        if let PeerSource::Static(list) = &source
            && !list.contains(&advertise)
        {
            return Err(invalid(
                "PEER_ADVERTISE_ADDRESS",
                &advertise,
                "must be one of PEERS (how the other peers reach this node)",
            ));
        }
        let mode = match self.cluster_mode.to_ascii_lowercase().as_str() {
            "forward" => ClusterMode::Forward,
            "divided" => ClusterMode::Divided,
            "lease" => ClusterMode::Lease,
            _ => {
                return Err(invalid(
                    "SLUICE_CLUSTER_MODE",
                    &self.cluster_mode,
                    "expected forward, divided or lease",
                ));
            }
        };
        let lease = self.lease_timing()?;
        if self.peer_timeout_ms == 0 {
            return Err(invalid("SLUICE_PEER_TIMEOUT_MS", 0, "must be at least 1"));
        }
        let parent = self.parent(&source, &advertise, mode, &lease)?;
        Ok(Some(ClusterConfig {
            peers: source,
            advertise,
            listen: SocketAddr::from(([0, 0, 0, 0], self.peer_port)),
            mode,
            timeout: Duration::from_millis(self.peer_timeout_ms),
            batch_window: Duration::from_micros(self.peer_batch_window_us),
            write_behind: None,
            lease,
            parent,
        }))
    }

    /// SLUICE_LEASE_PARENT with its timing and SLUICE_LEASE_CLUSTER_NAME; `None` when unset.
    fn parent(
        &self,
        source: &PeerSource,
        advertise: &str,
        mode: ClusterMode,
        lease: &LeaseTiming,
    ) -> Result<Option<ParentConfig>, SettingsError> {
        const VAR: &str = "SLUICE_LEASE_PARENT";
        let peers = host_ports(VAR, &self.lease_parent)?;
        if peers.is_empty() {
            return Ok(None);
        }
        if mode != ClusterMode::Lease {
            return Err(invalid(
                VAR,
                &self.lease_parent,
                "needs SLUICE_CLUSTER_MODE=lease: the parent leases capacity to this cluster's \
                 key owners, who lease it on to the nodes",
            ));
        }
        let in_both = peers.iter().find(|p| match source {
            PeerSource::Static(list) => list.contains(p),
            PeerSource::Dns { .. } => *p == advertise,
        });
        if let Some(p) = in_both {
            return Err(invalid(
                VAR,
                p,
                "is one of this cluster's own peers: a cluster cannot be its own parent",
            ));
        }
        let timing = self.parent_timing(lease)?;
        let name = self.cluster_name(source)?;
        let expected = self.lease_parent_expected_clusters;
        let expected_clusters = NonZeroU32::new(expected)
            .filter(|n| n.get() <= 1000)
            .ok_or_else(|| {
                invalid(
                    "SLUICE_LEASE_PARENT_EXPECTED_CLUSTERS",
                    expected,
                    "must be between 1 and 1000",
                )
            })?;
        Ok(Some(ParentConfig {
            peers,
            name,
            timing,
            expected_clusters,
        }))
    }

    /// SLUICE_LEASE_PARENT_RENEW_MS and SLUICE_LEASE_PARENT_TIMEOUT_MS, with lease mode's
    /// duration (how long a key is kept idle) and table bound.
    fn parent_timing(&self, lease: &LeaseTiming) -> Result<ParentTiming, SettingsError> {
        let renew_ms = self.lease_parent_renew_ms;
        let renew_floor = lease.renew.as_millis();
        if u128::from(renew_ms) < renew_floor || renew_ms > 10_000 {
            return Err(invalid(
                "SLUICE_LEASE_PARENT_RENEW_MS",
                renew_ms,
                format!("must be between SLUICE_LEASE_RENEW_MS ({renew_floor}) and 10000"),
            ));
        }
        let timeout_ms = in_range(
            "SLUICE_LEASE_PARENT_TIMEOUT_MS",
            self.lease_parent_timeout_ms,
            1..=60_000,
        )?;
        Ok(ParentTiming {
            renew: Duration::from_millis(renew_ms),
            timeout: Duration::from_millis(timeout_ms),
            idle: lease.duration,
            max_bytes: lease.max_bytes,
        })
    }

    /// SLUICE_LEASE_CLUSTER_NAME, or with PEERS its default.
    fn cluster_name(&self, source: &PeerSource) -> Result<String, SettingsError> {
        Ok(match self.lease_cluster_name.as_deref().map(str::trim) {
            Some(n) if !n.is_empty() => {
                let ok = n.len() <= 128 && !n.contains(|c: char| c.is_whitespace() || c == ',');
                if !ok {
                    return Err(invalid(
                        "SLUICE_LEASE_CLUSTER_NAME",
                        n,
                        "must be 1 to 128 characters with no spaces or commas",
                    ));
                }
                n.to_owned()
            }
            _ => match source {
                PeerSource::Static(list) => default_cluster_name(list),
                // The same Service in each region has the same name: no default.
                PeerSource::Dns { .. } => {
                    return Err(invalid(
                        "SLUICE_LEASE_CLUSTER_NAME",
                        "",
                        "must be set with SLUICE_LEASE_PARENT and PEERS_DNS: it names this \
                         cluster at the parent, and each child cluster needs its own",
                    ));
                }
            },
        })
    }

    /// SLUICE_LEASE_RENEW_MS, SLUICE_LEASE_DURATION_MS and SLUICE_LEASE_MAX_BYTES.
    fn lease_timing(&self) -> Result<LeaseTiming, SettingsError> {
        let (renew, duration) = (self.lease_renew_ms, self.lease_duration_ms);
        in_range("SLUICE_LEASE_RENEW_MS", renew, 10..=10_000)?;
        if duration < 2 * renew || duration > 600_000 {
            return Err(invalid(
                "SLUICE_LEASE_DURATION_MS",
                duration,
                format!(
                    "must be at least twice SLUICE_LEASE_RENEW_MS ({}) and at most 600000",
                    2 * renew
                ),
            ));
        }
        let max_bytes = table_bytes("SLUICE_LEASE_MAX_BYTES", self.lease_max_bytes, MIB)?;
        let free = self.lease_free_share_percent;
        if free > 90 {
            return Err(invalid(
                "SLUICE_LEASE_FREE_SHARE_PERCENT",
                free,
                "must be between 0 and 90 (the rest of each limit is what leases hand out)",
            ));
        }
        Ok(LeaseTiming {
            renew: Duration::from_millis(renew),
            duration: Duration::from_millis(duration),
            max_bytes,
            free_share_ppm: free * 10_000,
        })
    }

    /// PEERS (each `host:port`) or PEERS_DNS, not both; `None` for neither.
    fn peer_source(&self) -> Result<Option<PeerSource>, SettingsError> {
        let list = host_ports("PEERS", &self.peers)?;
        let dns = self.peers_dns.as_deref().filter(|d| !d.is_empty());
        match (list.is_empty(), dns) {
            (true, None) => Ok(None),
            (false, Some(_)) => Err(invalid(
                "PEERS",
                &self.peers,
                "set PEERS or PEERS_DNS, not both",
            )),
            (false, None) => Ok(Some(PeerSource::Static(host_ports("PEERS", &self.peers)?))),
            (true, Some(name)) => Ok(Some(PeerSource::Dns {
                name: name.to_owned(),
                port: self.peer_port,
            })),
        }
    }

    /// PEER_ADVERTISE_ADDRESS, else `<hostname>:PEER_PORT`.
    fn advertise(&self) -> String {
        match self
            .peer_advertise_address
            .as_deref()
            .filter(|a| !a.is_empty())
        {
            Some(a) => a.to_owned(),
            None => {
                let host = std::fs::read_to_string("/etc/hostname")
                    .map(|h| h.trim().to_owned())
                    .unwrap_or_else(|_| "localhost".into());
                format!("{host}:{}", self.peer_port)
            }
        }
    }

    /// SLUICE_PEER_WRITE_BEHIND: checked against the other settings before any port is bound.
    /// The Redis connection settings are REDIS_URL's own, so one Redis setup serves either use.
    pub(super) fn write_behind(
        &self,
        backend_type: Option<&str>,
        redis: &RedisArgs,
        cluster: Option<&ClusterConfig>,
        key_prefix: &str,
    ) -> Result<Option<WriteBehind>, SettingsError> {
        const VAR: &str = "SLUICE_PEER_WRITE_BEHIND";
        let (enabled, interval_ms) = (self.peer_write_behind, self.peer_write_behind_ms);
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
        match cluster.mode {
            ClusterMode::Forward => {}
            ClusterMode::Divided => {
                return Err(invalid(
                    VAR,
                    true,
                    "needs SLUICE_CLUSTER_MODE=forward: in divided mode no node owns a counter, \
                 so there is nothing to take over",
                ));
            }
            ClusterMode::Lease => {
                return Err(invalid(
                    VAR,
                    true,
                    "needs SLUICE_CLUSTER_MODE=forward: in lease mode a key's new owner rebuilds \
                 it from what the nodes report holding, not from Redis",
                ));
            }
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
        in_range("SLUICE_PEER_WRITE_BEHIND_MS", interval_ms, 10..=60_000)?;
        Ok(Some(WriteBehind {
            redis: redis.clone().validate()?,
            interval: Duration::from_millis(interval_ms),
            key_prefix: key_prefix.to_owned(),
        }))
    }

    /// PEERS or PEERS_DNS beside the Redis backend, which already shares counters.
    /// Peers beside a backend that shares counters already (Redis, memcached): refused.
    pub(super) fn peers_beside_shared_backend(&self, backend: &Backend) -> SettingsError {
        let (var, value) = if self.peers.trim().is_empty() {
            ("PEERS_DNS", self.peers_dns.as_deref().unwrap_or_default())
        } else {
            ("PEERS", self.peers.as_str())
        };
        let reason = match backend {
            Backend::Memcache(_) => {
                "the memcache backend (BACKEND_TYPE=memcache) already shares counters between \
                 replicas, so peers would be unused; unset the peers, or BACKEND_TYPE"
            }
            _ => {
                "the Redis backend (BACKEND_TYPE=redis, or REDIS_URL alone) already shares \
                 counters between replicas, so peers would be unused; unset the peers, or keep \
                 them and set SLUICE_PEER_WRITE_BEHIND=true to write their counters behind to Redis"
            }
        };
        invalid(var, value, reason)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{error, settings};
    use super::super::*;
    use crate::cluster::ClusterMode;
    use crate::cluster::lease::LeaseTiming;

    #[test]
    fn lease_mode_and_its_timing_are_checked_naming_the_variable() {
        let peers = ["--peers", "a:1,b:1", "--peer-advertise-address", "a:1"];
        fn with<'a>(extra: &[&'a str]) -> Vec<&'a str> {
            let peers = ["--peers", "a:1,b:1", "--peer-advertise-address", "a:1"];
            [&peers[..], &["--cluster-mode", "lease"], extra].concat()
        }
        let cluster = settings(&with(&[])).unwrap().app.cluster.unwrap();
        assert_eq!(cluster.mode, ClusterMode::Lease);
        assert_eq!(cluster.lease, LeaseTiming::DEFAULT);
        let cluster = settings(&with(&[
            "--lease-renew-ms",
            "50",
            "--lease-duration-ms",
            "100",
            "--lease-max-bytes",
            "1048576",
        ]))
        .unwrap()
        .app
        .cluster
        .unwrap();
        assert_eq!(
            cluster.lease,
            LeaseTiming {
                renew: Duration::from_millis(50),
                duration: Duration::from_millis(100),
                max_bytes: 1 << 20,
                free_share_ppm: 500_000,
            }
        );
        for (args, starts) in [
            (&["--lease-renew-ms", "5"][..], "SLUICE_LEASE_RENEW_MS=5: "),
            (
                &["--lease-renew-ms", "100", "--lease-duration-ms", "150"][..],
                "SLUICE_LEASE_DURATION_MS=150: must be at least twice SLUICE_LEASE_RENEW_MS (200)",
            ),
            (
                &["--lease-max-bytes", "1000"][..],
                "SLUICE_LEASE_MAX_BYTES=1000: ",
            ),
            (
                &["--lease-free-share-percent", "91"][..],
                "SLUICE_LEASE_FREE_SHARE_PERCENT=91: must be between 0 and 90",
            ),
        ] {
            let err = error(&with(args));
            assert!(err.starts_with(starts), "{err}");
        }
        let err = error(&[&peers[..], &["--cluster-mode", "leased"]].concat());
        assert!(
            err.starts_with("SLUICE_CLUSTER_MODE=leased: expected forward, divided or lease"),
            "{err}"
        );
        let err = error(&with(&["--peer-write-behind", "--redis-url", "x:1"]));
        assert!(
            err.starts_with(
                "SLUICE_PEER_WRITE_BEHIND=true: needs SLUICE_CLUSTER_MODE=forward: in lease mode"
            ),
            "{err}"
        );
    }

    #[test]
    fn a_lease_parent_is_read_with_its_timing_and_the_clusters_name() {
        fn with<'a>(mode: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
            let peers = ["--peers", "b:1,a:1", "--peer-advertise-address", "a:1"];
            [&peers[..], &["--cluster-mode", mode], extra].concat()
        }
        let parent = |args: &[&str]| settings(args).unwrap().app.cluster.unwrap().parent;
        assert_eq!(parent(&with("lease", &[])), None);
        let p = parent(&with("lease", &["--lease-parent", "r1:9, r2:9"])).unwrap();
        assert_eq!(p.peers, ["r1:9", "r2:9"]);
        assert_eq!(
            (p.timing.renew, p.timing.timeout, p.timing.idle),
            (
                Duration::from_millis(200),
                Duration::from_millis(1000),
                LeaseTiming::DEFAULT.duration
            )
        );
        // The default name is the same on every node: the sorted PEERS, hashed.
        let other = ["--peers", "a:1,b:1", "--peer-advertise-address", "b:1"];
        let q = parent(
            &[
                &other[..],
                &["--cluster-mode", "lease", "--lease-parent", "r1:9"],
            ]
            .concat(),
        );
        assert_eq!(q.unwrap().name, p.name);
        assert!(p.name.starts_with("peers-"), "{}", p.name);
        // Two child clusters expected unless told.
        assert_eq!(p.expected_clusters.get(), 2);
        let three = parent(&with(
            "lease",
            &[
                "--lease-parent",
                "r1:9",
                "--lease-parent-expected-clusters",
                "3",
            ],
        ));
        assert_eq!(three.unwrap().expected_clusters.get(), 3);
        let named = parent(&with(
            "lease",
            &["--lease-parent", "r1:9", "--lease-cluster-name", "eu-west"],
        ));
        assert_eq!(named.unwrap().name, "eu-west");
    }

    #[test]
    fn the_expected_child_clusters_are_1_to_1000() {
        let peers = ["--peers", "b:1,a:1", "--peer-advertise-address", "a:1"];
        for n in ["0", "1001"] {
            let args = [
                &peers[..],
                &["--cluster-mode", "lease", "--lease-parent", "r1:9"],
                &["--lease-parent-expected-clusters", n],
            ]
            .concat();
            let err = error(&args);
            let want = format!("SLUICE_LEASE_PARENT_EXPECTED_CLUSTERS={n}: must be between 1");
            assert!(err.starts_with(&want), "{err}");
        }
    }

    #[test]
    fn a_bad_lease_parent_is_refused_naming_the_variable() {
        fn with<'a>(mode: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
            let peers = ["--peers", "b:1,a:1", "--peer-advertise-address", "a:1"];
            [&peers[..], &["--cluster-mode", mode], extra].concat()
        }
        for (args, starts) in [
            (
                with("forward", &["--lease-parent", "r1:9"]),
                "SLUICE_LEASE_PARENT=r1:9: needs SLUICE_CLUSTER_MODE=lease",
            ),
            (
                with("lease", &["--lease-parent", "r1"]),
                "SLUICE_LEASE_PARENT=r1: expected host:port",
            ),
            (
                with("lease", &["--lease-parent", "r1:9,b:1"]),
                "SLUICE_LEASE_PARENT=b:1: is one of this cluster's own peers",
            ),
            (
                with(
                    "lease",
                    &["--lease-parent", "r1:9", "--lease-parent-renew-ms", "50"],
                ),
                "SLUICE_LEASE_PARENT_RENEW_MS=50: must be between SLUICE_LEASE_RENEW_MS (100)",
            ),
            (
                with(
                    "lease",
                    &["--lease-parent", "r1:9", "--lease-parent-timeout-ms", "0"],
                ),
                "SLUICE_LEASE_PARENT_TIMEOUT_MS=0: must be between 1 and 60000",
            ),
            (
                with(
                    "lease",
                    &["--lease-parent", "r1:9", "--lease-cluster-name", "a b"],
                ),
                "SLUICE_LEASE_CLUSTER_NAME=a b: must be 1 to 128 characters",
            ),
            (
                vec!["--lease-parent", "r1:9"],
                "SLUICE_LEASE_PARENT=r1:9: needs PEERS or PEERS_DNS",
            ),
            (
                vec![
                    "--peers-dns",
                    "sluice-peers.rl",
                    "--cluster-mode",
                    "lease",
                    "--lease-parent",
                    "r1:9",
                ],
                "SLUICE_LEASE_CLUSTER_NAME=: must be set with SLUICE_LEASE_PARENT and PEERS_DNS",
            ),
        ] {
            let err = error(&args);
            assert!(err.starts_with(starts), "{err}");
        }
    }

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
            super::super::redis::urls(&wb.redis.main),
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
