//! envoyproxy/ratelimit's memcache settings (MEMCACHE_*) and Sluice's own (SLUICE_MEMCACHE_*),
//! into [`MemcacheConfig`]. The cache settings both remote backends share
//! (EXPIRATION_JITTER_MAX_SECONDS, LOCAL_CACHE_SIZE_IN_BYTES,
//! STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT) are read with the Redis ones, as in Go.

use std::net::SocketAddr;
use std::time::Duration;

use clap::ArgAction;

use super::parse::{Named, go_duration, in_range, non_empty, parse_go_bool, parsed};
use super::redis::RedisArgs;
use super::tls::key_pair_files;
use super::{SettingsError, invalid};
use crate::store::memcache::{MemcacheConfig, MemcacheServers, MemcacheTls, split_host_port};
use crate::store::redis::BreakerSettings;

/// gomemcache's idle connections per server when MEMCACHE_MAX_IDLE_CONNS is 0 or less.
const GO_DEFAULT_MAX_IDLE_CONNS: usize = 2;
/// The most connections kept per server: each carries many calls at once.
const MAX_CONNS: usize = 64;

/// The memcache backend's settings, raw.
#[derive(Clone, Debug, clap::Args)]
pub struct MemcacheArgs {
    /// memcached servers, comma-separated `host:port` (or socket paths); keys are spread over
    /// them in this order, as the Go service's client does. Not with MEMCACHE_SRV.
    #[arg(long, env = "MEMCACHE_HOST_PORT", help_heading = "Memcache")]
    pub memcache_host_port: Option<String>,
    /// Connections kept per server, each carrying many calls at once (0 or less: 2, Go's
    /// default; at most 64).
    #[arg(
        long,
        env = "MEMCACHE_MAX_IDLE_CONNS",
        default_value_t = 2,
        allow_negative_numbers = true,
        help_heading = "Memcache"
    )]
    pub memcache_max_idle_conns: i64,
    /// A DNS SRV name (`_service._proto.name`) whose records are the servers, sorted by
    /// `target:port`. Not with MEMCACHE_HOST_PORT.
    #[arg(long, env = "MEMCACHE_SRV", help_heading = "Memcache")]
    pub memcache_srv: Option<String>,
    /// How often MEMCACHE_SRV is looked up again (a Go duration; 0: never).
    #[arg(
        long,
        env = "MEMCACHE_SRV_REFRESH",
        default_value = "0",
        help_heading = "Memcache"
    )]
    pub memcache_srv_refresh: String,
    /// The nameserver (`ip:port`) asked for MEMCACHE_SRV instead of /etc/resolv.conf's.
    #[arg(
        long,
        env = "SLUICE_MEMCACHE_SRV_RESOLVER",
        value_name = "IP:PORT",
        help_heading = "Memcache"
    )]
    pub memcache_srv_resolver: Option<String>,
    /// TLS to memcached, with the MEMCACHE_TLS_* files below.
    #[arg(
        long,
        env = "MEMCACHE_TLS",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Memcache"
    )]
    pub memcache_tls: bool,
    /// PEM client certificate (with MEMCACHE_TLS_CLIENT_KEY) presented to memcached.
    #[arg(
        long,
        env = "MEMCACHE_TLS_CLIENT_CERT",
        default_value = "",
        help_heading = "Memcache"
    )]
    pub memcache_tls_client_cert: String,
    /// PEM private key of MEMCACHE_TLS_CLIENT_CERT.
    #[arg(
        long,
        env = "MEMCACHE_TLS_CLIENT_KEY",
        default_value = "",
        help_heading = "Memcache"
    )]
    pub memcache_tls_client_key: String,
    /// PEM CA certificate(s) memcached's certificate must chain to (default: the system's).
    #[arg(
        long,
        env = "MEMCACHE_TLS_CACERT",
        default_value = "",
        help_heading = "Memcache"
    )]
    pub memcache_tls_cacert: String,
    /// Accept a memcached certificate issued for another name (its chain is still verified).
    #[arg(
        long,
        env = "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Memcache"
    )]
    pub memcache_tls_skip_hostname_verification: bool,
    /// The deadline of one call to memcached (all its round trips), in milliseconds; the Go
    /// client's is 500.
    #[arg(
        long,
        env = "SLUICE_MEMCACHE_TIMEOUT_MS",
        default_value_t = 500,
        help_heading = "Memcache"
    )]
    pub memcache_timeout_ms: u64,
    /// Calls in flight to one server at once; a call waits for room within its deadline.
    #[arg(
        long,
        env = "SLUICE_MEMCACHE_MAX_PENDING",
        default_value_t = 1024,
        help_heading = "Memcache"
    )]
    pub memcache_max_pending: usize,
    /// While a server is down (its calls fail at once), how often it is probed (a new
    /// connection and `version`), in milliseconds.
    #[arg(
        long,
        env = "SLUICE_MEMCACHE_PROBE_INTERVAL_MS",
        default_value_t = 250,
        help_heading = "Memcache"
    )]
    pub memcache_probe_interval_ms: u64,
    /// Calls in a row that miss SLUICE_MEMCACHE_TIMEOUT_MS, with no answer in between, after
    /// which a server is taken for down.
    #[arg(
        long,
        env = "SLUICE_MEMCACHE_BREAKER_TIMEOUTS",
        default_value_t = 3,
        help_heading = "Memcache"
    )]
    pub memcache_breaker_timeouts: u32,
}

impl MemcacheArgs {
    /// The memcache backend's settings; `cache` holds the settings shared with Redis.
    pub(super) fn validate(&self, cache: &RedisArgs) -> Result<MemcacheConfig, SettingsError> {
        let timeout_ms = in_range(
            "SLUICE_MEMCACHE_TIMEOUT_MS",
            self.memcache_timeout_ms,
            1..=60_000,
        )?;
        in_range(
            "SLUICE_MEMCACHE_MAX_PENDING",
            self.memcache_max_pending,
            1..=65_536,
        )?;
        let conns = match usize::try_from(self.memcache_max_idle_conns) {
            Ok(0) | Err(_) => GO_DEFAULT_MAX_IDLE_CONNS,
            Ok(n) if n > MAX_CONNS => {
                return Err(invalid(
                    "MEMCACHE_MAX_IDLE_CONNS",
                    n,
                    format!(
                        "at most {MAX_CONNS}: Sluice keeps this many connections per server, \
                         each carrying many calls at once"
                    ),
                ));
            }
            Ok(n) => n,
        };
        Ok(MemcacheConfig {
            servers: self.servers()?,
            conns,
            max_pending: self.memcache_max_pending,
            timeout: Duration::from_millis(timeout_ms),
            expiration_jitter_max_seconds: cache.expiration_jitter_max_seconds,
            local_cache_size_in_bytes: cache.local_cache_size_in_bytes,
            local_cache_max_age: cache.local_cache_max_age()?,
            stop_cache_key_increment_when_overlimit: cache.stop_cache_key_increment_when_overlimit,
            breaker: self.breaker()?,
            tls: self.tls()?,
        })
    }

    fn servers(&self) -> Result<MemcacheServers, SettingsError> {
        let hosts = non_empty(self.memcache_host_port.as_deref());
        let srv = non_empty(self.memcache_srv.as_deref());
        match (hosts, srv) {
            (Some(_), Some(srv)) => Err(invalid(
                "MEMCACHE_SRV",
                srv,
                "both MEMCACHE_HOST_PORT and MEMCACHE_SRV are set; set one",
            )),
            (None, None) => Err(invalid(
                "BACKEND_TYPE",
                "memcache",
                "needs MEMCACHE_HOST_PORT (host:port,...) or MEMCACHE_SRV (a DNS SRV name)",
            )),
            (Some(hosts), None) => {
                let list: Vec<String> = hosts.split(',').map(|h| h.trim().to_owned()).collect();
                if let Some(bad) = list
                    .iter()
                    .find(|h| !h.contains('/') && split_host_port(h).is_none())
                {
                    return Err(invalid(
                        "MEMCACHE_HOST_PORT",
                        hosts,
                        format!("{bad:?} is neither host:port nor a socket path"),
                    ));
                }
                Ok(MemcacheServers::List(list))
            }
            (None, Some(srv)) => {
                if crate::store::memcache::srv::parse_srv(srv).is_none() {
                    return Err(invalid(
                        "MEMCACHE_SRV",
                        srv,
                        "not an SRV name: expected _service._proto.name",
                    ));
                }
                let refresh = go_duration(
                    "MEMCACHE_SRV_REFRESH",
                    &self.memcache_srv_refresh,
                    "30s (0: never)",
                )?;
                let resolver = non_empty(self.memcache_srv_resolver.as_deref())
                    .map(|r| {
                        let ip_port = |r: &str| r.parse::<SocketAddr>().ok();
                        parsed(
                            "SLUICE_MEMCACHE_SRV_RESOLVER",
                            r,
                            ip_port,
                            "expected ip:port",
                        )
                    })
                    .transpose()?;
                Ok(MemcacheServers::Srv {
                    name: srv.to_owned(),
                    refresh: (!refresh.is_zero()).then_some(refresh),
                    resolver,
                })
            }
        }
    }

    fn breaker(&self) -> Result<BreakerSettings, SettingsError> {
        super::redis_breaker::breaker_settings(
            Named::new(
                "SLUICE_MEMCACHE_PROBE_INTERVAL_MS",
                self.memcache_probe_interval_ms,
            ),
            Named::new(
                "SLUICE_MEMCACHE_BREAKER_TIMEOUTS",
                self.memcache_breaker_timeouts,
            ),
            false,
        )
    }

    /// MEMCACHE_TLS's files, read and checked now; not read without MEMCACHE_TLS, as in Go.
    fn tls(&self) -> Result<Option<MemcacheTls>, SettingsError> {
        use crate::tls::{ClientTls, PemFile};
        if !self.memcache_tls {
            return Ok(None);
        }
        let identity = key_pair_files(
            Named::new(
                "MEMCACHE_TLS_CLIENT_CERT",
                self.memcache_tls_client_cert.as_str(),
            ),
            Named::new(
                "MEMCACHE_TLS_CLIENT_KEY",
                self.memcache_tls_client_key.as_str(),
            ),
        )?;
        let client = ClientTls::from_files(
            non_empty(Some(&self.memcache_tls_cacert))
                .map(|p| PemFile::new("MEMCACHE_TLS_CACERT", p)),
            identity,
            None,
        )?;
        Ok(Some(MemcacheTls {
            client,
            skip_hostname_verification: self.memcache_tls_skip_hostname_verification,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{error, settings};
    use crate::app::Backend;
    use crate::store::memcache::MemcacheServers;

    fn memcache(args: &[&str]) -> crate::store::memcache::MemcacheConfig {
        let mut all = vec!["--backend-type", "memcache"];
        all.extend_from_slice(args);
        match settings(&all).expect("settings").app.backend {
            Backend::Memcache(m) => *m,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_go_variables_make_the_memcache_backend() {
        let m = memcache(&["--memcache-host-port", "m1:11211, m2:11211,/run/mc.sock"]);
        assert_eq!(
            m.servers,
            MemcacheServers::List(vec![
                "m1:11211".into(),
                "m2:11211".into(),
                "/run/mc.sock".into()
            ])
        );
        assert_eq!(m.conns, 2);
        assert_eq!(m.max_pending, 1024);
        assert_eq!(m.timeout, std::time::Duration::from_millis(500));
        assert_eq!(m.expiration_jitter_max_seconds, 300);
        assert_eq!(m.tls, None);
        // 0 or less idle connections is gomemcache's default, 2.
        let m = memcache(&[
            "--memcache-host-port",
            "m:1",
            "--memcache-max-idle-conns",
            "-1",
        ]);
        assert_eq!(m.conns, 2);
        let m = memcache(&[
            "--memcache-srv",
            "_memcache._tcp.mc.default.svc",
            "--memcache-srv-refresh",
            "30s",
            "--memcache-srv-resolver",
            "127.0.0.1:5353",
        ]);
        assert_eq!(
            m.servers,
            MemcacheServers::Srv {
                name: "_memcache._tcp.mc.default.svc".into(),
                refresh: Some(std::time::Duration::from_secs(30)),
                resolver: Some("127.0.0.1:5353".parse().unwrap()),
            }
        );
    }

    #[test]
    fn bad_memcache_settings_name_the_variable() {
        let cases: &[(&[&str], &str)] = &[
            (&[], "BACKEND_TYPE=memcache: needs MEMCACHE_HOST_PORT"),
            (
                &["--memcache-host-port", "m:1", "--memcache-srv", "_m._tcp.x"],
                "MEMCACHE_SRV=_m._tcp.x: both MEMCACHE_HOST_PORT and MEMCACHE_SRV",
            ),
            (
                &["--memcache-host-port", "m1"],
                "MEMCACHE_HOST_PORT=m1: \"m1\" is neither",
            ),
            (
                &["--memcache-srv", "memcache.x"],
                "MEMCACHE_SRV=memcache.x: not an SRV name",
            ),
            (
                &[
                    "--memcache-srv",
                    "_m._tcp.x",
                    "--memcache-srv-refresh",
                    "soon",
                ],
                "MEMCACHE_SRV_REFRESH=soon",
            ),
            (
                &[
                    "--memcache-srv",
                    "_m._tcp.x",
                    "--memcache-srv-resolver",
                    "dns",
                ],
                "SLUICE_MEMCACHE_SRV_RESOLVER=dns",
            ),
        ];
        check(cases);
    }

    #[test]
    fn bad_memcache_connection_settings_name_the_variable() {
        let cases: &[(&[&str], &str)] = &[
            (
                &["--memcache-host-port", "m:1", "--memcache-timeout-ms", "0"],
                "SLUICE_MEMCACHE_TIMEOUT_MS=0",
            ),
            (
                &["--memcache-host-port", "m:1", "--memcache-max-pending", "0"],
                "SLUICE_MEMCACHE_MAX_PENDING=0",
            ),
            (
                &[
                    "--memcache-host-port",
                    "m:1",
                    "--memcache-max-idle-conns",
                    "100",
                ],
                "MEMCACHE_MAX_IDLE_CONNS=100: at most 64",
            ),
            (
                &[
                    "--memcache-host-port",
                    "m:1",
                    "--memcache-probe-interval-ms",
                    "1",
                ],
                "SLUICE_MEMCACHE_PROBE_INTERVAL_MS=1",
            ),
            (
                &[
                    "--memcache-host-port",
                    "m:1",
                    "--memcache-breaker-timeouts",
                    "0",
                ],
                "SLUICE_MEMCACHE_BREAKER_TIMEOUTS=0",
            ),
            (
                &[
                    "--memcache-host-port",
                    "m:1",
                    "--memcache-tls",
                    "--memcache-tls-cacert",
                    "/missing.pem",
                ],
                "MEMCACHE_TLS_CACERT",
            ),
            (
                &[
                    "--memcache-host-port",
                    "m:1",
                    "--memcache-tls",
                    "--memcache-tls-client-cert",
                    "/c.pem",
                ],
                "MEMCACHE_TLS_CLIENT_CERT=/c.pem: needs MEMCACHE_TLS_CLIENT_KEY",
            ),
        ];
        check(cases);
    }

    /// Each case's arguments, with BACKEND_TYPE=memcache, fail naming what its message starts
    /// with.
    fn check(cases: &[(&[&str], &str)]) {
        for (args, want) in cases {
            let mut all = vec!["--backend-type", "memcache"];
            all.extend_from_slice(args);
            let e = error(&all);
            assert!(e.starts_with(want), "{args:?}: {e}");
        }
    }

    #[test]
    fn peers_beside_memcached_are_refused() {
        let e = error(&[
            "--backend-type",
            "memcache",
            "--memcache-host-port",
            "m:1",
            "--peers",
            "a:1,b:1",
            "--peer-advertise-address",
            "a:1",
        ]);
        assert!(
            e.starts_with("PEERS=a:1,b:1: the memcache backend (BACKEND_TYPE=memcache) already"),
            "{e}"
        );
    }

    #[test]
    fn memcache_files_are_not_read_without_memcache_tls() {
        let m = memcache(&[
            "--memcache-host-port",
            "m:1",
            "--memcache-tls-cacert",
            "/missing.pem",
        ]);
        assert_eq!(m.tls, None);
    }
}
