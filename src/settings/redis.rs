//! envoyproxy/ratelimit's Redis settings (REDIS_*, REDIS_PERSECOND_*) and BACKEND_TYPE, into
//! [`RedisConfig`] and [`Backend`]: typed nodes and credentials from the Go service's socket
//! type, address list and REDIS_AUTH ([`super::redis_address`]), the topology, and the
//! REDIS_TLS_* files read and checked. The store makes redis-rs's connection settings of them.

use std::time::Duration;

use clap::ArgAction;

use super::parse::{MIB, non_empty, parse_go_bool, parse_go_duration, table_bytes};
use super::redis_address::{NodeSyntax, auth};
use super::tls::key_pair;
use super::{SettingsError, invalid};
use crate::app::Backend;
use crate::secret::Secret;
use crate::store::allowance::AllowanceTuning;
use crate::store::redis::{
    Credentials, RedisConfig, RedisTarget, RedisTls, RedisTopology, StartupBackoff,
    read_credentials,
};

/// A memory backend counts per node. Where the operator configured Redis (REDIS_URL without
/// BACKEND_TYPE, as envoyproxy/ratelimit deployments do) Sluice uses Redis: falling back to
/// memory would multiply every limit by the replica count without a word.
pub(super) fn backend(
    backend_type: Option<&str>,
    redis: RedisArgs,
    memcache: &super::MemcacheArgs,
) -> Result<Backend, SettingsError> {
    let kind = match backend_type {
        Some(v) => v.to_ascii_lowercase(),
        None if redis.redis_url.is_some() => "redis".to_owned(),
        None => "memory".to_owned(),
    };
    match kind.as_str() {
        "memory" => Ok(Backend::Memory),
        "redis" => redis.validate().map(|r| Backend::Redis(Box::new(r))),
        "memcache" => memcache
            .validate(&redis)
            .map(|m| Backend::Memcache(Box::new(m))),
        _ => Err(invalid(
            "BACKEND_TYPE",
            kind,
            "unknown backend; expected memory, redis or memcache",
        )),
    }
}

/// envoyproxy/ratelimit's Redis settings, raw.
#[derive(Clone, Debug, clap::Args)]
pub struct RedisArgs {
    /// `tcp` or `unix` (envoyproxy/ratelimit's default is unix).
    #[arg(
        long,
        env = "REDIS_SOCKET_TYPE",
        default_value = "unix",
        help_heading = "Redis"
    )]
    pub redis_socket_type: String,
    /// host:port (tcp), a socket path (unix), or a redis:// URL. For REDIS_TYPE=cluster a
    /// comma-separated list of host:port seeds.
    #[arg(long, env = "REDIS_URL", help_heading = "Redis")]
    pub redis_url: Option<String>,
    /// `single`, `cluster` or `sentinel` (REDIS_URL is then `master name,host:port,...`).
    #[arg(
        long,
        env = "REDIS_TYPE",
        default_value = "single",
        help_heading = "Redis"
    )]
    pub redis_type: String,
    /// `password` or `user:password`.
    #[arg(
        long,
        env = "REDIS_AUTH",
        default_value = "",
        hide_env_values = true,
        help_heading = "Redis"
    )]
    pub redis_auth: Secret,
    /// A file holding REDIS_AUTH's value, read at start and again for every new connection, so
    /// a rotated Secret is used without a restart. Not with REDIS_AUTH.
    #[arg(
        long,
        env = "REDIS_AUTH_FILE",
        value_name = "PATH",
        help_heading = "Redis"
    )]
    pub redis_auth_file: Option<std::path::PathBuf>,
    /// TLS to Redis (and to its sentinels), with the REDIS_TLS_* files below.
    #[arg(
        long,
        env = "REDIS_TLS",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Redis"
    )]
    pub redis_tls: bool,
    /// PEM client certificate (with REDIS_TLS_CLIENT_KEY) presented to Redis: mutual TLS.
    #[arg(
        long,
        env = "REDIS_TLS_CLIENT_CERT",
        default_value = "",
        help_heading = "Redis"
    )]
    pub redis_tls_client_cert: String,
    /// PEM private key of REDIS_TLS_CLIENT_CERT.
    #[arg(
        long,
        env = "REDIS_TLS_CLIENT_KEY",
        default_value = "",
        help_heading = "Redis"
    )]
    pub redis_tls_client_key: String,
    /// PEM CA certificate(s) Redis's certificate must chain to (default: the system's roots).
    #[arg(
        long,
        env = "REDIS_TLS_CACERT",
        default_value = "",
        help_heading = "Redis"
    )]
    pub redis_tls_cacert: String,
    /// Accept a Redis certificate issued for another name (its chain is still verified).
    #[arg(
        long,
        env = "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Redis"
    )]
    pub redis_tls_skip_hostname_verification: bool,
    /// `password` or `user:password` for the sentinels (REDIS_AUTH is the master's).
    #[arg(
        long,
        env = "REDIS_SENTINEL_AUTH",
        default_value = "",
        hide_env_values = true,
        help_heading = "Redis"
    )]
    pub redis_sentinel_auth: Secret,
    /// A file holding REDIS_SENTINEL_AUTH's value, read for every lookup. Not with
    /// REDIS_SENTINEL_AUTH.
    #[arg(
        long,
        env = "REDIS_SENTINEL_AUTH_FILE",
        value_name = "PATH",
        help_heading = "Redis"
    )]
    pub redis_sentinel_auth_file: Option<std::path::PathBuf>,
    /// Accepted for compatibility: Sluice multiplexes calls over one connection per Redis and
    /// pipelines concurrent requests automatically.
    #[arg(
        long,
        env = "REDIS_POOL_SIZE",
        default_value_t = 10,
        help_heading = "Redis"
    )]
    pub redis_pool_size: u32,
    /// Accepted for compatibility (see REDIS_POOL_SIZE).
    #[arg(
        long,
        env = "REDIS_PIPELINE_WINDOW",
        default_value = "0",
        help_heading = "Redis"
    )]
    pub redis_pipeline_window: String,
    /// Accepted for compatibility; a no-op, as in envoyproxy/ratelimit.
    #[arg(
        long,
        env = "REDIS_PIPELINE_LIMIT",
        default_value_t = 0,
        help_heading = "Redis"
    )]
    pub redis_pipeline_limit: u64,
    /// Accepted for compatibility (see REDIS_POOL_SIZE).
    #[arg(
        long,
        env = "REDIS_PERSECOND_POOL_SIZE",
        default_value_t = 10,
        help_heading = "Redis"
    )]
    pub redis_persecond_pool_size: u32,
    /// Accepted for compatibility (see REDIS_POOL_SIZE).
    #[arg(
        long,
        env = "REDIS_PERSECOND_PIPELINE_WINDOW",
        default_value = "0",
        help_heading = "Redis"
    )]
    pub redis_persecond_pipeline_window: String,
    /// Accepted for compatibility; a no-op, as in envoyproxy/ratelimit.
    #[arg(
        long,
        env = "REDIS_PERSECOND_PIPELINE_LIMIT",
        default_value_t = 0,
        help_heading = "Redis"
    )]
    pub redis_persecond_pipeline_limit: u64,
    /// `WAIT` only: with one multiplexed connection per Redis there is no pool to run empty.
    /// `CREATE` and `ERROR` are refused (envoyproxy/ratelimit panics on them too).
    #[arg(
        long,
        env = "REDIS_POOL_ON_EMPTY_BEHAVIOR",
        default_value = "WAIT",
        help_heading = "Redis"
    )]
    pub redis_pool_on_empty_behavior: String,
    /// REDIS_POOL_ON_EMPTY_BEHAVIOR of the per-second Redis.
    #[arg(
        long,
        env = "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
        default_value = "WAIT",
        help_heading = "Redis"
    )]
    pub redis_persecond_pool_on_empty_behavior: String,
    /// Accepted for compatibility: the cluster client sends each node's commands on its own
    /// multiplexed connection, concurrently.
    #[arg(
        long,
        env = "REDIS_CLUSTER_PIPELINE_PARALLELISM",
        default_value_t = 1,
        help_heading = "Redis"
    )]
    pub redis_cluster_pipeline_parallelism: u32,
    /// First wait before the start-up PING is retried (Go duration); it doubles each time.
    #[arg(
        long,
        env = "REDIS_STARTUP_INITIAL_INTERVAL",
        default_value = "1s",
        help_heading = "Redis"
    )]
    pub redis_startup_initial_interval: String,
    /// Longest wait between start-up PINGs (Go duration).
    #[arg(
        long,
        env = "REDIS_STARTUP_MAX_INTERVAL",
        default_value = "30s",
        help_heading = "Redis"
    )]
    pub redis_startup_max_interval: String,
    /// Give up and exit (code 1) when Redis has not answered for this long since start-up
    /// (Go duration); 0 retries forever.
    #[arg(
        long,
        env = "REDIS_STARTUP_MAX_ELAPSED_TIME",
        default_value = "0",
        help_heading = "Redis"
    )]
    pub redis_startup_max_elapsed_time: String,
    /// Deadline of every Redis call (Go duration: 250ms, 1s). Unlike envoyproxy/ratelimit's
    /// 10 s dial timeout, it bounds each request, so a dead Redis costs at most this long.
    #[arg(
        long,
        env = "REDIS_TIMEOUT",
        default_value = "500ms",
        help_heading = "Redis"
    )]
    pub redis_timeout: String,
    /// Send per-second limits to a second Redis (REDIS_PERSECOND_URL and friends).
    #[arg(
        long,
        env = "REDIS_PERSECOND",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Redis"
    )]
    pub redis_persecond: bool,
    /// REDIS_SOCKET_TYPE of the per-second Redis.
    #[arg(
        long,
        env = "REDIS_PERSECOND_SOCKET_TYPE",
        default_value = "unix",
        help_heading = "Redis"
    )]
    pub redis_persecond_socket_type: String,
    /// REDIS_URL of the per-second Redis.
    #[arg(long, env = "REDIS_PERSECOND_URL", help_heading = "Redis")]
    pub redis_persecond_url: Option<String>,
    /// REDIS_TYPE of the per-second Redis.
    #[arg(
        long,
        env = "REDIS_PERSECOND_TYPE",
        default_value = "single",
        help_heading = "Redis"
    )]
    pub redis_persecond_type: String,
    /// REDIS_AUTH of the per-second Redis.
    #[arg(
        long,
        env = "REDIS_PERSECOND_AUTH",
        default_value = "",
        hide_env_values = true,
        help_heading = "Redis"
    )]
    pub redis_persecond_auth: Secret,
    /// REDIS_AUTH_FILE of the per-second Redis.
    #[arg(
        long,
        env = "REDIS_PERSECOND_AUTH_FILE",
        value_name = "PATH",
        help_heading = "Redis"
    )]
    pub redis_persecond_auth_file: Option<std::path::PathBuf>,
    /// REDIS_TLS of the per-second Redis (with the same REDIS_TLS_* files, as in Go).
    #[arg(
        long,
        env = "REDIS_PERSECOND_TLS",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Redis"
    )]
    pub redis_persecond_tls: bool,
    /// REDIS_SENTINEL_AUTH of the per-second Redis.
    #[arg(
        long,
        env = "REDIS_PERSECOND_SENTINEL_AUTH",
        default_value = "",
        hide_env_values = true,
        help_heading = "Redis"
    )]
    pub redis_persecond_sentinel_auth: Secret,
    /// REDIS_SENTINEL_AUTH_FILE of the per-second Redis.
    #[arg(
        long,
        env = "REDIS_PERSECOND_SENTINEL_AUTH_FILE",
        value_name = "PATH",
        help_heading = "Redis"
    )]
    pub redis_persecond_sentinel_auth_file: Option<std::path::PathBuf>,
    /// Each key's EXPIRE is its unit plus a random 0..this many seconds, as in the Go service.
    #[arg(
        long,
        env = "EXPIRATION_JITTER_MAX_SECONDS",
        default_value_t = 300,
        help_heading = "Redis"
    )]
    pub expiration_jitter_max_seconds: u64,
    /// Size of the local over-limit cache; 0 turns it off. Keys found over the limit are
    /// answered OVER locally until their window ends, without a Redis call.
    #[arg(
        long,
        env = "LOCAL_CACHE_SIZE_IN_BYTES",
        default_value_t = 0,
        help_heading = "Redis"
    )]
    pub local_cache_size_in_bytes: u64,
    /// How long the local over-limit cache trusts an entry, in milliseconds (1 to
    /// 31536000000): after it, the key's next request asks Redis (or memcached) again. A refund
    /// through another replica frees a key there; this is how long this one may keep refusing
    /// it.
    #[arg(
        long,
        env = "SLUICE_LOCAL_CACHE_MAX_AGE_MS",
        default_value_t = 1000,
        help_heading = "Redis"
    )]
    pub local_cache_max_age_ms: u64,
    /// Do not increment the other keys of a request one of whose keys is over the limit.
    #[arg(
        long,
        env = "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Redis"
    )]
    pub stop_cache_key_increment_when_overlimit: bool,
    /// Fixed windows on Redis: a replica that sees a key often reserves a batch of its hits
    /// from Redis at once (never past the limit) and decides locally inside it; a cold key
    /// costs one INCRBY per call as before (docs/redis.md, "Allowances").
    #[arg(
        long,
        env = "SLUICE_REDIS_ALLOWANCE",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Redis"
    )]
    pub redis_allowance: bool,
    /// With SLUICE_REDIS_ALLOWANCE: how much of a key's demand a batch covers, in milliseconds
    /// (10 to 10000); a key is reserved once its demand over it is 4 hits or more.
    #[arg(
        long,
        env = "SLUICE_REDIS_ALLOWANCE_HORIZON_MS",
        default_value_t = 100,
        help_heading = "Redis"
    )]
    pub redis_allowance_horizon_ms: u64,
    /// With SLUICE_REDIS_ALLOWANCE: the memory of the batches table (1 MiB to 64 GiB), each key
    /// charged its length plus 352 bytes; past it, new keys go to Redis on every call until
    /// idle keys are forgotten.
    #[arg(
        long,
        env = "SLUICE_REDIS_ALLOWANCE_MAX_BYTES",
        default_value_t = 32 << 20,
        help_heading = "Redis"
    )]
    pub redis_allowance_max_bytes: usize,
}

/// REDIS_POOL_ON_EMPTY_BEHAVIOR: only `WAIT` (any case) describes what Sluice does.
pub(super) fn pool_on_empty(var: &'static str, value: &str) -> Result<(), SettingsError> {
    match value.trim().to_ascii_uppercase().as_str() {
        "WAIT" => Ok(()),
        "CREATE" | "ERROR" => Err(invalid(
            var,
            value,
            "Sluice multiplexes one connection per Redis, so no pool runs empty; only WAIT \
             is accepted (envoyproxy/ratelimit panics on CREATE and ERROR too)",
        )),
        _ => Err(invalid(var, value, "expected WAIT")),
    }
}

impl RedisArgs {
    pub(super) fn validate(self) -> Result<RedisConfig, SettingsError> {
        let (main, per_second) = self.targets()?;
        let timeout = parse_go_duration(&self.redis_timeout)
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                invalid(
                    "REDIS_TIMEOUT",
                    &self.redis_timeout,
                    "expected a positive Go duration such as 250ms or 1s",
                )
            })?;
        self.check_pool_settings()?;
        Ok(RedisConfig {
            main,
            per_second,
            timeout,
            expiration_jitter_max_seconds: self.expiration_jitter_max_seconds,
            local_cache_size_in_bytes: self.local_cache_size_in_bytes,
            local_cache_max_age: self.local_cache_max_age()?,
            stop_cache_key_increment_when_overlimit: self.stop_cache_key_increment_when_overlimit,
            allowance: self.allowance()?,
            startup: self.startup_backoff()?,
            // Set from RedisBreakerArgs by ServeArgs::validate.
            breaker: Default::default(),
        })
    }

    /// SLUICE_REDIS_ALLOWANCE and its horizon and bound; `None` when off.
    fn allowance(&self) -> Result<Option<AllowanceTuning>, SettingsError> {
        if !self.redis_allowance {
            return Ok(None);
        }
        if self.stop_cache_key_increment_when_overlimit {
            // The flag's rule (a refused request's other keys are not counted) needs every
            // key's count before a request is decided; a batch decides without it.
            return Err(invalid(
                "SLUICE_REDIS_ALLOWANCE",
                true,
                "cannot be on with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, whose rule needs \
                 every key's count in Redis before a request is decided; turn one of them off",
            ));
        }
        let ms = self.redis_allowance_horizon_ms;
        if !(10..=10_000).contains(&ms) {
            return Err(invalid(
                "SLUICE_REDIS_ALLOWANCE_HORIZON_MS",
                ms,
                "must be between 10 and 10000",
            ));
        }
        let max_bytes = table_bytes(
            "SLUICE_REDIS_ALLOWANCE_MAX_BYTES",
            self.redis_allowance_max_bytes,
            MIB,
        )?;
        Ok(Some(AllowanceTuning::new(ms * 1_000, max_bytes)))
    }

    /// SLUICE_LOCAL_CACHE_MAX_AGE_MS: at least a millisecond, at most a year (the longest
    /// window, so the cache can trust an entry until its window ends, as the Go service does).
    pub(super) fn local_cache_max_age(&self) -> Result<Duration, SettingsError> {
        const MAX_MS: u64 = 31_536_000_000;
        let ms = self.local_cache_max_age_ms;
        if !(1..=MAX_MS).contains(&ms) {
            return Err(invalid(
                "SLUICE_LOCAL_CACHE_MAX_AGE_MS",
                ms,
                format!("must be between 1 and {MAX_MS} (a year)"),
            ));
        }
        Ok(Duration::from_millis(ms))
    }

    /// REDIS_URL's target, and REDIS_PERSECOND_URL's with REDIS_PERSECOND.
    fn targets(&self) -> Result<(RedisTarget, Option<RedisTarget>), SettingsError> {
        // One set of files serves both Redis, as in Go (there is no REDIS_PERSECOND_TLS_CACERT).
        // Without REDIS_TLS they are not read, as in Go.
        let tls = if self.redis_tls || self.redis_persecond_tls {
            Some(self.tls()?)
        } else {
            None
        };
        let main = redis_target(
            ("REDIS_URL", self.redis_url.as_deref()),
            ("REDIS_SOCKET_TYPE", &self.redis_socket_type),
            ("REDIS_TYPE", &self.redis_type),
            (&self.redis_auth, &self.redis_sentinel_auth),
            ("REDIS_TLS", tls.clone().filter(|_| self.redis_tls)),
        )?;
        let main = with_credential_files(
            main,
            ("REDIS_AUTH", &self.redis_auth),
            ("REDIS_AUTH_FILE", self.redis_auth_file.as_deref()),
            ("REDIS_SENTINEL_AUTH", &self.redis_sentinel_auth),
            (
                "REDIS_SENTINEL_AUTH_FILE",
                self.redis_sentinel_auth_file.as_deref(),
            ),
        )?;
        if !self.redis_persecond {
            return Ok((main, None));
        }
        let per_second = redis_target(
            ("REDIS_PERSECOND_URL", self.redis_persecond_url.as_deref()),
            (
                "REDIS_PERSECOND_SOCKET_TYPE",
                &self.redis_persecond_socket_type,
            ),
            ("REDIS_PERSECOND_TYPE", &self.redis_persecond_type),
            (
                &self.redis_persecond_auth,
                &self.redis_persecond_sentinel_auth,
            ),
            (
                "REDIS_PERSECOND_TLS",
                tls.filter(|_| self.redis_persecond_tls),
            ),
        )?;
        let per_second = with_credential_files(
            per_second,
            ("REDIS_PERSECOND_AUTH", &self.redis_persecond_auth),
            (
                "REDIS_PERSECOND_AUTH_FILE",
                self.redis_persecond_auth_file.as_deref(),
            ),
            (
                "REDIS_PERSECOND_SENTINEL_AUTH",
                &self.redis_persecond_sentinel_auth,
            ),
            (
                "REDIS_PERSECOND_SENTINEL_AUTH_FILE",
                self.redis_persecond_sentinel_auth_file.as_deref(),
            ),
        )?;
        Ok((main, Some(per_second)))
    }

    /// The Go service's pool and pipeline settings, which mean nothing to one multiplexed
    /// connection, are still checked for syntax, and an empty pool may only wait.
    fn check_pool_settings(&self) -> Result<(), SettingsError> {
        parse_go_duration(&self.redis_pipeline_window).ok_or_else(|| {
            invalid(
                "REDIS_PIPELINE_WINDOW",
                &self.redis_pipeline_window,
                "expected a Go duration such as 0 or 150us",
            )
        })?;
        parse_go_duration(&self.redis_persecond_pipeline_window).ok_or_else(|| {
            invalid(
                "REDIS_PERSECOND_PIPELINE_WINDOW",
                &self.redis_persecond_pipeline_window,
                "expected a Go duration such as 0 or 150us",
            )
        })?;
        pool_on_empty(
            "REDIS_POOL_ON_EMPTY_BEHAVIOR",
            &self.redis_pool_on_empty_behavior,
        )?;
        pool_on_empty(
            "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
            &self.redis_persecond_pool_on_empty_behavior,
        )
    }

    /// REDIS_STARTUP_INITIAL_INTERVAL, _MAX_INTERVAL and _MAX_ELAPSED_TIME.
    fn startup_backoff(&self) -> Result<StartupBackoff, SettingsError> {
        let positive = |var: &'static str, value: &str| {
            parse_go_duration(value)
                .filter(|d| !d.is_zero())
                .ok_or_else(|| invalid(var, value, "expected a positive Go duration such as 1s"))
        };
        let initial = positive(
            "REDIS_STARTUP_INITIAL_INTERVAL",
            &self.redis_startup_initial_interval,
        )?;
        let max = positive(
            "REDIS_STARTUP_MAX_INTERVAL",
            &self.redis_startup_max_interval,
        )?;
        if max < initial {
            return Err(invalid(
                "REDIS_STARTUP_MAX_INTERVAL",
                &self.redis_startup_max_interval,
                format!(
                    "must not be shorter than REDIS_STARTUP_INITIAL_INTERVAL={}",
                    self.redis_startup_initial_interval
                ),
            ));
        }
        let max_elapsed =
            parse_go_duration(&self.redis_startup_max_elapsed_time).ok_or_else(|| {
                invalid(
                    "REDIS_STARTUP_MAX_ELAPSED_TIME",
                    &self.redis_startup_max_elapsed_time,
                    "expected a Go duration such as 0 (retry forever) or 5m",
                )
            })?;
        Ok(StartupBackoff {
            initial,
            max,
            max_elapsed: (!max_elapsed.is_zero()).then_some(max_elapsed),
        })
    }

    /// Reads the REDIS_TLS_* files and checks them as the other TLS clients' are, so a missing,
    /// unreadable or mismatched file stops start-up with a message naming it (Go panics).
    pub(super) fn tls(&self) -> Result<RedisTls, SettingsError> {
        use crate::tls::{ClientTls, KeyPairFiles, PemFile};
        let identity = key_pair(
            ("REDIS_TLS_CLIENT_CERT", &self.redis_tls_client_cert),
            ("REDIS_TLS_CLIENT_KEY", &self.redis_tls_client_key),
        )?;
        let client = ClientTls::from_files(
            non_empty(Some(&self.redis_tls_cacert)).map(|p| PemFile::new("REDIS_TLS_CACERT", p)),
            identity.map(|(cert, key)| KeyPairFiles {
                cert: PemFile::new("REDIS_TLS_CLIENT_CERT", cert),
                key: PemFile::new("REDIS_TLS_CLIENT_KEY", key),
            }),
            None,
        )?;
        Ok(RedisTls {
            ca_pem: client.ca_pem,
            client_pem: client.identity_pem,
            skip_hostname_verification: self.redis_tls_skip_hostname_verification,
        })
    }
}

/// A target with its credential files: the auth file's for its nodes (a Sentinel group's
/// master), the sentinel one's for a Sentinel group's sentinels.
fn with_credential_files(
    mut target: RedisTarget,
    auth: (&'static str, &Secret),
    auth_file: (&'static str, Option<&std::path::Path>),
    sentinel_auth: (&'static str, &Secret),
    sentinel_file: (&'static str, Option<&std::path::Path>),
) -> Result<RedisTarget, SettingsError> {
    let auth = credentials_file(auth, auth_file)?;
    let sentinel_auth = credentials_file(sentinel_auth, sentinel_file)?;
    match &mut target.topology {
        RedisTopology::Sentinel {
            master_credentials, ..
        } => {
            *master_credentials = auth;
            target.credentials = sentinel_auth;
        }
        _ => target.credentials = auth,
    }
    Ok(target)
}

/// REDIS_AUTH_FILE (or REDIS_SENTINEL_AUTH_FILE): read once now, so a missing, unreadable or
/// empty file stops start-up, naming the variable; refused beside the variable it replaces.
fn credentials_file(
    (auth_var, auth): (&'static str, &Secret),
    (file_var, file): (&'static str, Option<&std::path::Path>),
) -> Result<Credentials, SettingsError> {
    let Some(path) = file.filter(|p| !p.as_os_str().is_empty()) else {
        return Ok(Credentials::Fixed);
    };
    let shown = path.display();
    if !auth.is_empty() {
        return Err(invalid(
            file_var,
            shown,
            format!("set {auth_var} or {file_var}, not both"),
        ));
    }
    read_credentials(path).map_err(|reason| invalid(file_var, shown, reason))?;
    Ok(Credentials::File(path.to_owned()))
}

/// A target from the Go service's (socket type, address list, type, auth) settings.
///
/// As in Go, a cluster's seeds and the sentinels are TCP addresses whatever REDIS_SOCKET_TYPE
/// says, and REDIS_AUTH is the master's password while REDIS_SENTINEL_AUTH is the sentinels'.
pub(super) fn redis_target(
    (url_var, url): (&'static str, Option<&str>),
    (socket_var, socket_type): (&'static str, &str),
    (type_var, redis_type): (&'static str, &str),
    (redis_auth, sentinel_auth): (&Secret, &Secret),
    (tls_var, tls): (&'static str, Option<RedisTls>),
) -> Result<RedisTarget, SettingsError> {
    let Some(url) = url.filter(|u| !u.trim().is_empty()) else {
        return Err(invalid(url_var, "", "required for the Redis backend"));
    };
    let mut items: Vec<&str> = url
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    let topology = topology(
        (url_var, url),
        &mut items,
        (type_var, redis_type),
        redis_auth,
    )?;
    let unix = match socket_type.to_ascii_lowercase().as_str() {
        "tcp" => false,
        "unix" => topology == RedisTopology::Single,
        _ => return Err(invalid(socket_var, socket_type, "expected tcp or unix")),
    };
    // The items' credentials: the sentinels' for sentinels, else REDIS_AUTH.
    let items_auth = match topology {
        RedisTopology::Sentinel { .. } => auth(sentinel_auth.expose()),
        _ => auth(redis_auth.expose()),
    };
    let syntax = NodeSyntax {
        url_var,
        socket_var,
        tls_var,
        tls: tls.is_some(),
        unix,
        auth: items_auth.as_ref(),
    };
    let nodes = items
        .iter()
        .map(|item| syntax.node(item))
        .collect::<Result<Vec<_>, _>>()?;
    if nodes.len() > 1 && topology == RedisTopology::Single {
        return Err(invalid(
            url_var,
            url,
            "several addresses need REDIS_TYPE=cluster (or sentinel)",
        ));
    }
    Ok(RedisTarget {
        nodes,
        credentials: Credentials::Fixed,
        topology,
        tls,
    })
}

/// REDIS_TYPE. For a sentinel the first item is the master's name, taken out of `items`.
fn topology(
    (url_var, url): (&'static str, &str),
    items: &mut Vec<&str>,
    (type_var, redis_type): (&'static str, &str),
    redis_auth: &Secret,
) -> Result<RedisTopology, SettingsError> {
    match redis_type.to_ascii_lowercase().as_str() {
        "single" => Ok(RedisTopology::Single),
        "cluster" => Ok(RedisTopology::Cluster),
        "sentinel" => {
            let expected =
                "expected <master name>,<sentinel host:port>,... for REDIS_TYPE=sentinel";
            if items.len() < 2 {
                return Err(invalid(url_var, url, expected));
            }
            let name = items.remove(0);
            let looks_like_address = name.contains("://")
                || name
                    .rsplit_once(':')
                    .is_some_and(|(_, port)| port.parse::<u16>().is_ok());
            if looks_like_address {
                return Err(invalid(
                    url_var,
                    url,
                    format!("{expected}: the first item is the master's name, not an address"),
                ));
            }
            Ok(RedisTopology::Sentinel {
                master_name: name.to_owned(),
                master_auth: auth(redis_auth.expose()),
                master_credentials: Credentials::Fixed,
            })
        }
        _ => Err(invalid(
            type_var,
            redis_type,
            "expected single, sentinel or cluster",
        )),
    }
}

#[cfg(test)]
/// The URLs a target's nodes were given to redis-rs as before they were typed (credentials
/// percent-encoded), so these tests keep their expectations; the store's tests check that
/// redis-rs reads each such URL as the node's connection settings.
pub(super) fn urls(target: &RedisTarget) -> Vec<String> {
    use crate::store::redis::{Auth, RedisAddress, RedisNode};
    let encode = |s: &str| crate::percent::encode(s, b"");
    let tls = target.tls.is_some();
    let url = |node: &RedisNode| match &node.address {
        RedisAddress::Tcp { .. } => {
            let name = node.name(tls);
            let userinfo = match &node.auth {
                None => String::new(),
                Some(a) => format!(
                    "{}:{}@",
                    encode(a.username.as_deref().unwrap_or_default()),
                    encode(a.password.expose())
                ),
            };
            name.replacen("://", &format!("://{userinfo}"), 1)
        }
        RedisAddress::Unix(path) => {
            let query = match &node.auth {
                None => String::new(),
                Some(Auth {
                    username: Some(user),
                    password,
                }) => format!("?user={}&pass={}", encode(user), encode(password.expose())),
                Some(Auth { password, .. }) => format!("?pass={}", encode(password.expose())),
            };
            format!("redis+unix://{}{query}", path.display())
        }
    };
    target.nodes.iter().map(url).collect()
}

#[cfg(test)]
mod tests {
    use super::super::tests::{error, parse, serve, settings};
    use super::super::*;
    use super::*;
    use crate::store::redis::Auth;

    /// REDIS_AUTH's credentials, as the settings keep them.
    fn auth_of(user: Option<&str>, password: &str) -> Option<Auth> {
        Some(Auth {
            username: user.map(str::to_owned),
            password: Secret::new(password),
        })
    }

    fn redis_error(extra: &[&str]) -> String {
        let mut args = vec!["--backend-type", "redis", "--redis-url", "127.0.0.1:6379"];
        args.extend_from_slice(extra);
        error(&args)
    }

    #[test]
    fn redis_allowances_are_off_by_default_and_their_settings_checked() {
        let base = ["--backend-type", "redis", "--redis-url", "127.0.0.1:6379"];
        assert_eq!(redis_settings(&base).allowance, None);
        let on = redis_settings(&[&base[..], &["--redis-allowance"]].concat());
        assert_eq!(on.allowance, Some(AllowanceTuning::new(100_000, 32 << 20)));
        assert_eq!(
            redis_error(&[
                "--redis-allowance",
                "--stop-cache-key-increment-when-overlimit"
            ]),
            "SLUICE_REDIS_ALLOWANCE=true: cannot be on with \
             STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, whose rule needs every key's count in \
             Redis before a request is decided; turn one of them off"
        );
        for (args, want) in [
            (
                ["--redis-allowance-horizon-ms", "5"],
                "SLUICE_REDIS_ALLOWANCE_HORIZON_MS=5: must be between 10 and 10000",
            ),
            (
                ["--redis-allowance-max-bytes", "1000"],
                "SLUICE_REDIS_ALLOWANCE_MAX_BYTES=1000: must be between 1048576 (1 MiB) and \
                 68719476736 (64 GiB)",
            ),
        ] {
            let err = redis_error(&[&["--redis-allowance"][..], &args[..]].concat());
            assert_eq!(err, want);
        }
    }

    #[test]
    fn the_local_cache_max_age_is_a_second_by_default_and_checked() {
        let r = redis_settings(&["--backend-type", "redis", "--redis-url", "127.0.0.1:6379"]);
        assert_eq!(r.local_cache_max_age, Duration::from_secs(1));
        let r = redis_settings(&[
            "--backend-type",
            "redis",
            "--redis-url",
            "127.0.0.1:6379",
            "--local-cache-max-age-ms",
            "300",
        ]);
        assert_eq!(r.local_cache_max_age, Duration::from_millis(300));
        for bad in ["0", "31536000001"] {
            let err = redis_error(&["--local-cache-max-age-ms", bad]);
            assert_eq!(
                err,
                format!(
                    "SLUICE_LOCAL_CACHE_MAX_AGE_MS={bad}: must be between 1 and 31536000000 (a year)"
                )
            );
        }
    }

    #[test]
    fn redis_startup_backoff_defaults_parses_and_checks() {
        let r = redis_settings(&["--backend-type", "redis", "--redis-url", "127.0.0.1:6379"]);
        assert_eq!(r.startup, StartupBackoff::default());
        assert_eq!(r.startup.initial, Duration::from_secs(1));
        assert_eq!(r.startup.max, Duration::from_secs(30));
        assert_eq!(r.startup.max_elapsed, None);
        let r = redis_settings(&[
            "--backend-type",
            "redis",
            "--redis-url",
            "127.0.0.1:6379",
            "--redis-startup-initial-interval",
            "100ms",
            "--redis-startup-max-interval",
            "2s",
            "--redis-startup-max-elapsed-time",
            "5m",
        ]);
        assert_eq!(
            r.startup,
            StartupBackoff {
                initial: Duration::from_millis(100),
                max: Duration::from_secs(2),
                max_elapsed: Some(Duration::from_secs(300)),
            }
        );
        let err = redis_error(&["--redis-startup-initial-interval", "0"]);
        assert!(
            err.starts_with("REDIS_STARTUP_INITIAL_INTERVAL=0: "),
            "{err}"
        );
        let err = redis_error(&["--redis-startup-max-interval", "soon"]);
        assert!(
            err.starts_with("REDIS_STARTUP_MAX_INTERVAL=soon: "),
            "{err}"
        );
        let err = redis_error(&[
            "--redis-startup-initial-interval",
            "10s",
            "--redis-startup-max-interval",
            "1s",
        ]);
        assert!(
            err.starts_with("REDIS_STARTUP_MAX_INTERVAL=1s: ")
                && err.contains("REDIS_STARTUP_INITIAL_INTERVAL=10s"),
            "{err}"
        );
        let err = redis_error(&["--redis-startup-max-elapsed-time", "1"]);
        assert!(
            err.starts_with("REDIS_STARTUP_MAX_ELAPSED_TIME=1: "),
            "{err}"
        );
    }

    #[test]
    fn redis_pool_knobs_are_accepted_and_pool_on_empty_is_wait_only() {
        // Accepted and meaningless: one multiplexed connection per Redis.
        redis_settings(&[
            "--backend-type",
            "redis",
            "--redis-url",
            "127.0.0.1:6379",
            "--redis-persecond-pool-size",
            "50",
            "--redis-persecond-pipeline-window",
            "150us",
            "--redis-persecond-pipeline-limit",
            "8",
            "--redis-cluster-pipeline-parallelism",
            "4",
            "--redis-pool-on-empty-behavior",
            "wait",
            "--redis-persecond-pool-on-empty-behavior",
            "WAIT",
        ]);
        for value in ["CREATE", "ERROR", "error"] {
            let err = redis_error(&["--redis-pool-on-empty-behavior", value]);
            assert!(
                err.starts_with(&format!("REDIS_POOL_ON_EMPTY_BEHAVIOR={value}: "))
                    && err.contains("only WAIT"),
                "{err}"
            );
        }
        let err = redis_error(&["--redis-persecond-pool-on-empty-behavior", "BLOCK"]);
        assert!(
            err.starts_with("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR=BLOCK: "),
            "{err}"
        );
        let err = redis_error(&["--redis-persecond-pipeline-window", "fast"]);
        assert!(
            err.starts_with("REDIS_PERSECOND_PIPELINE_WINDOW=fast: "),
            "{err}"
        );
        let err = parse(&["--redis-cluster-pipeline-parallelism", "many"])
            .expect_err("negative")
            .to_string();
        assert!(err.contains("REDIS_CLUSTER_PIPELINE_PARALLELISM"), "{err}");
    }

    fn redis_settings(args: &[&str]) -> RedisConfig {
        match settings(args).unwrap().app.backend {
            Backend::Redis(r) => *r,
            other => panic!("expected the Redis backend, got {other:?}"),
        }
    }

    /// Passwords and OTLP header values show neither in the raw flags' debug output nor in the
    /// validated settings'.
    #[test]
    fn secrets_never_show_in_debug_output() {
        let args = [
            "--redis-url",
            "redis://admin:url-s3cr3t@10.0.0.1:6379",
            "--redis-persecond",
            "--redis-persecond-socket-type",
            "tcp",
            "--redis-persecond-url",
            "10.0.0.2:6379",
            "--redis-persecond-auth",
            "u:auth-s3cr3t",
            "--redis-sentinel-auth",
            "sentinel-s3cr3t",
            "--tracing-enabled",
            "--otel-exporter-otlp-headers",
            "authorization=Bearer%20header-s3cr3t",
        ];
        // The raw REDIS_URL is as given (`--help` shows it too): its credentials are the
        // operator's choice; REDIS_AUTH is the variable for secrets.
        let raw = format!("{:?}", serve(&args)).replace("url-s3cr3t", "");
        let validated = format!("{:?}", settings(&args).unwrap());
        for debug in [raw, validated] {
            assert!(!debug.contains("s3cr3t"), "{debug}");
        }
    }

    #[test]
    fn redis_auth_files_are_read_at_start_and_kept_out_of_the_urls() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("auth");
        std::fs::write(&file, "sluice:s3cret\n").unwrap();
        let path = file.to_str().unwrap();
        let r = redis_settings(&[
            "--backend-type",
            "redis",
            "--redis-url",
            "127.0.0.1:6379",
            "--redis-socket-type",
            "tcp",
            "--redis-auth-file",
            path,
        ]);
        assert_eq!(urls(&r.main), ["redis://127.0.0.1:6379"]);
        assert_eq!(r.main.credentials, Credentials::File(file.clone()));
        // Sentinel: the master's file and the sentinels' file each go where REDIS_AUTH and
        // REDIS_SENTINEL_AUTH would.
        let sentinel_file = dir.path().join("sentinel");
        std::fs::write(&sentinel_file, "admin").unwrap();
        let r = redis_settings(&[
            "--backend-type",
            "redis",
            "--redis-type",
            "sentinel",
            "--redis-url",
            "m,10.0.0.1:26379",
            "--redis-auth-file",
            path,
            "--redis-sentinel-auth-file",
            sentinel_file.to_str().unwrap(),
        ]);
        assert_eq!(urls(&r.main), ["redis://10.0.0.1:26379"]);
        assert_eq!(r.main.credentials, Credentials::File(sentinel_file));
        assert_eq!(
            r.main.topology,
            RedisTopology::Sentinel {
                master_name: "m".into(),
                master_auth: None,
                master_credentials: Credentials::File(file.clone()),
            }
        );
        // Errors name the variable and the file.
        let missing = dir.path().join("missing");
        let err = redis_error(&["--redis-auth-file", missing.to_str().unwrap()]);
        assert!(
            err.starts_with(&format!(
                "REDIS_AUTH_FILE={}: cannot open",
                missing.display()
            )),
            "{err}"
        );
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let err = redis_error(&["--redis-auth-file", empty.to_str().unwrap()]);
        assert!(err.ends_with("is empty"), "{err}");
        let err = redis_error(&["--redis-auth", "x", "--redis-auth-file", path]);
        assert!(
            err.ends_with("set REDIS_AUTH or REDIS_AUTH_FILE, not both"),
            "{err}"
        );
        // The per-second Redis has its own.
        let r = redis_settings(&[
            "--backend-type",
            "redis",
            "--redis-url",
            "127.0.0.1:6379",
            "--redis-persecond",
            "--redis-persecond-url",
            "127.0.0.1:6380",
            "--redis-persecond-socket-type",
            "tcp",
            "--redis-persecond-auth-file",
            path,
        ]);
        assert_eq!(r.main.credentials, Credentials::Fixed);
        let ps = r.per_second.unwrap();
        assert_eq!(ps.credentials, Credentials::File(file.clone()));
        assert_eq!(urls(&ps), ["redis://127.0.0.1:6380"]);
    }

    #[test]
    fn redis_sentinel_takes_the_master_name_first_and_separate_credentials() {
        let r = redis_settings(&[
            "--redis-type",
            "SENTINEL",
            "--redis-url",
            "mymaster, 10.0.0.1:26379,sentinel-2:26379",
            "--redis-auth",
            "master-pass",
            "--redis-sentinel-auth",
            "admin:s3nt/nel",
        ]);
        // REDIS_AUTH is the master's, REDIS_SENTINEL_AUTH the sentinels'; the default unix
        // socket type does not apply to sentinels (Go dials them over TCP).
        assert_eq!(
            r.main.topology,
            RedisTopology::Sentinel {
                master_name: "mymaster".into(),
                master_auth: auth_of(None, "master-pass"),
                master_credentials: Credentials::Fixed,
            }
        );
        assert_eq!(
            urls(&r.main),
            [
                "redis://admin:s3nt%2Fnel@10.0.0.1:26379",
                "redis://admin:s3nt%2Fnel@sentinel-2:26379"
            ]
        );
        assert_eq!(r.main.tls, None);

        let err = error(&["--redis-type", "sentinel", "--redis-url", "mymaster"]);
        assert_eq!(
            err,
            "REDIS_URL=mymaster: expected <master name>,<sentinel host:port>,... for REDIS_TYPE=sentinel"
        );
        let err = error(&[
            "--redis-type",
            "sentinel",
            "--redis-url",
            "127.0.0.1:26379,127.0.0.1:26380",
        ]);
        assert!(
            err.ends_with("the first item is the master's name, not an address"),
            "{err}"
        );
        let err = error(&["--redis-type", "sentinel", "--redis-url", "m,nowhere"]);
        assert_eq!(err, "REDIS_URL=nowhere: expected host:port");
        let err = error(&["--redis-url", "x:1", "--redis-type", "replicated"]);
        assert_eq!(
            err,
            "REDIS_TYPE=replicated: expected single, sentinel or cluster"
        );

        // The per-second twins.
        let r = redis_settings(&[
            "--redis-url",
            "/run/redis.sock",
            "--redis-persecond",
            "--redis-persecond-type",
            "sentinel",
            "--redis-persecond-url",
            "fast,127.0.0.1:26379",
            "--redis-persecond-auth",
            "u:p",
            "--redis-persecond-sentinel-auth",
            "sp",
        ]);
        let ps = r.per_second.unwrap();
        assert_eq!(
            ps.topology,
            RedisTopology::Sentinel {
                master_name: "fast".into(),
                master_auth: auth_of(Some("u"), "p"),
                master_credentials: Credentials::Fixed,
            }
        );
        assert_eq!(urls(&ps), ["redis://:sp@127.0.0.1:26379"]);
    }

    #[test]
    #[expect(
        clippy::too_many_lines,
        reason = "one end-to-end scenario, step by step; to split next"
    )]
    fn redis_tls_reads_and_checks_its_files_before_start() {
        let pki = test_pki::TestPki::new();
        let leaf = pki.leaf("client", &["localhost", "127.0.0.1"]);
        let other = pki.leaf("other", &["localhost"]);
        let path = |p: &std::path::Path| p.to_str().unwrap().to_owned();
        let (ca, cert, key) = (path(&pki.ca), path(&leaf.cert), path(&leaf.key));
        let tcp = [
            "--redis-socket-type",
            "tcp",
            "--redis-url",
            "127.0.0.1:6380",
        ];
        let with = |extra: &[&str]| -> Vec<String> {
            tcp.iter().chain(extra).map(|s| s.to_string()).collect()
        };
        let run =
            |args: Vec<String>| settings(&args.iter().map(String::as_str).collect::<Vec<_>>());

        let r = match run(with(&[
            "--redis-tls",
            "--redis-tls-cacert",
            &ca,
            "--redis-tls-client-cert",
            &cert,
            "--redis-tls-client-key",
            &key,
            "--redis-tls-skip-hostname-verification",
        ]))
        .unwrap()
        .app
        .backend
        {
            Backend::Redis(r) => r,
            other => panic!("expected the Redis backend, got {other:?}"),
        };
        assert_eq!(urls(&r.main), ["rediss://127.0.0.1:6380"]);
        let tls = r.main.tls.clone().unwrap();
        assert_eq!(tls.ca_pem, Some(std::fs::read(&ca).unwrap()));
        assert_eq!(
            tls.client_pem,
            Some((std::fs::read(&cert).unwrap(), std::fs::read(&key).unwrap()))
        );
        assert!(tls.skip_hostname_verification);
        // The key never shows in a debug print.
        assert!(!format!("{r:?}").contains("PRIVATE KEY"), "{r:?}");

        // TLS alone: the system's roots, no client certificate; redis:// URLs become rediss://.
        let r = redis_settings(&[
            "--redis-tls=true",
            "--redis-url",
            "redis://:pw@10.0.0.1:6380",
        ]);
        assert_eq!(urls(&r.main), ["rediss://:pw@10.0.0.1:6380"]);
        assert_eq!(
            r.main.tls,
            Some(RedisTls {
                ca_pem: None,
                client_pem: None,
                skip_hostname_verification: false
            })
        );
        // Without REDIS_TLS the files are not read, as in Go.
        let r = redis_settings(&[
            "--redis-socket-type",
            "tcp",
            "--redis-url",
            "127.0.0.1:6379",
            "--redis-tls-cacert",
            "/nonexistent/ca.pem",
        ]);
        assert_eq!(r.main.tls, None);
        assert_eq!(urls(&r.main), ["redis://127.0.0.1:6379"]);

        let err = |extra: &[&str]| run(with(extra)).unwrap_err().to_string();
        assert_eq!(
            err(&["--redis-tls", "--redis-tls-client-cert", &cert]),
            format!(
                "REDIS_TLS_CLIENT_CERT={cert}: needs REDIS_TLS_CLIENT_KEY, the certificate's private key"
            )
        );
        assert_eq!(
            err(&["--redis-tls", "--redis-tls-client-key", &key]),
            format!(
                "REDIS_TLS_CLIENT_KEY={key}: needs REDIS_TLS_CLIENT_CERT, the certificate of this key"
            )
        );
        let e = err(&["--redis-tls", "--redis-tls-cacert", "/nonexistent/ca.pem"]);
        assert!(
            e.starts_with("REDIS_TLS_CACERT=/nonexistent/ca.pem: cannot read the file: "),
            "{e}"
        );
        let e = err(&["--redis-tls", "--redis-tls-cacert", &key]);
        assert_eq!(
            e,
            format!("REDIS_TLS_CACERT={key}: no PEM certificate (BEGIN CERTIFICATE) in the file")
        );
        let e = err(&[
            "--redis-tls",
            "--redis-tls-client-cert",
            &cert,
            "--redis-tls-client-key",
            &cert,
        ]);
        assert!(
            e.starts_with(&format!("REDIS_TLS_CLIENT_KEY={cert}: no PEM private key")),
            "{e}"
        );
        let e = err(&[
            "--redis-tls",
            "--redis-tls-client-cert",
            &cert,
            "--redis-tls-client-key",
            &path(&other.key),
        ]);
        assert!(
            e.starts_with(&format!(
                "REDIS_TLS_CLIENT_KEY={}: the private key does not match the certificate in REDIS_TLS_CLIENT_CERT={cert}",
                path(&other.key)
            )),
            "{e}"
        );
        // Redis serves TLS on TCP only.
        let e = error(&["--redis-tls", "--redis-url", "/run/redis.sock"]);
        assert!(
            e.contains("needs a TCP address (REDIS_SOCKET_TYPE=tcp)"),
            "{e}"
        );
        let e = error(&["--redis-url", "rediss://10.0.0.1:6380"]);
        assert_eq!(
            e,
            "REDIS_URL=rediss://10.0.0.1:6380: a rediss:// URL needs REDIS_TLS=true (and its REDIS_TLS_* files)"
        );

        // REDIS_PERSECOND_TLS: the same files, for the per-second Redis only.
        let r = redis_settings(&[
            "--redis-socket-type",
            "tcp",
            "--redis-url",
            "127.0.0.1:6379",
            "--redis-persecond",
            "--redis-persecond-socket-type",
            "tcp",
            "--redis-persecond-url",
            "127.0.0.1:6380",
            "--redis-persecond-tls",
            "--redis-tls-cacert",
            &ca,
        ]);
        assert_eq!(r.main.tls, None);
        let ps = r.per_second.unwrap();
        assert_eq!(urls(&ps), ["rediss://127.0.0.1:6380"]);
        assert_eq!(ps.tls.unwrap().ca_pem, Some(std::fs::read(&ca).unwrap()));
    }

    #[test]
    fn backend_defaults_to_memory_and_to_redis_over_a_redis_url() {
        assert_eq!(settings(&[]).unwrap().app.backend, Backend::Memory);
        assert_eq!(
            settings(&["--backend-type", "memory", "--redis-url", "redis:6379"])
                .unwrap()
                .app
                .backend,
            Backend::Memory
        );
        // REDIS_URL alone means Redis, with the Go service's defaults (a unix socket).
        let Backend::Redis(r) = settings(&["--redis-url", "/run/redis.sock"])
            .unwrap()
            .app
            .backend
        else {
            panic!("expected the Redis backend");
        };
        assert_eq!(
            urls(&r.main),
            vec!["redis+unix:///run/redis.sock".to_string()]
        );
        assert_eq!(r.timeout, Duration::from_millis(500));
        assert_eq!(r.expiration_jitter_max_seconds, 300);
        let Backend::Redis(r) = settings(&[
            "--backend-type",
            "redis",
            "--redis-socket-type",
            "tcp",
            "--redis-url",
            "127.0.0.1:6379",
            "--redis-auth",
            "user:p@ss",
            "--redis-timeout",
            "250ms",
        ])
        .unwrap()
        .app
        .backend
        else {
            panic!("expected the Redis backend");
        };
        assert_eq!(
            urls(&r.main),
            vec!["redis://user:p%40ss@127.0.0.1:6379".to_string()]
        );
        assert_eq!(r.timeout, Duration::from_millis(250));
        let err = error(&["--backend-type", "redis"]);
        assert!(err.starts_with("REDIS_URL=: required"), "{err}");
        let err = error(&["--redis-url", "x:1", "--redis-type", "sentinel"]);
        assert!(
            err.starts_with("REDIS_URL=x:1: expected <master name>,<sentinel host:port>"),
            "{err}"
        );
        let err = error(&["--redis-url", "x:1", "--redis-timeout", "soon"]);
        assert!(err.starts_with("REDIS_TIMEOUT=soon"), "{err}");
        let err = error(&["--redis-url", "a:1,b:2", "--redis-socket-type", "tcp"]);
        assert!(err.contains("REDIS_TYPE=cluster"), "{err}");
        // A cluster's seeds are TCP addresses whatever REDIS_SOCKET_TYPE says, as in Go.
        let Backend::Redis(r) = settings(&["--redis-url", "a:1,b:2", "--redis-type", "cluster"])
            .unwrap()
            .app
            .backend
        else {
            panic!("expected the Redis backend");
        };
        assert_eq!(urls(&r.main), ["redis://a:1", "redis://b:2"]);
        assert_eq!(r.main.topology, RedisTopology::Cluster);
        assert_eq!(
            error(&["--backend-type", "etcd"]),
            "BACKEND_TYPE=etcd: unknown backend; expected memory, redis or memcache"
        );
        assert!(error(&["--backend-failure", "maybe"]).starts_with("SLUICE_BACKEND_FAILURE=maybe"));
    }
}
