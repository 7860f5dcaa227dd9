//! envoyproxy/ratelimit's Redis settings (REDIS_*, REDIS_PERSECOND_*), into [`RedisConfig`]:
//! typed nodes and credentials from the Go service's socket type, address list and REDIS_AUTH
//! ([`super::redis_address`]), the topology, and the REDIS_TLS_* files read and checked. The
//! store makes redis-rs's connection settings of them.

use std::path::Path;
use std::time::Duration;

use clap::ArgAction;

use super::parse::{
    MIB, Named, go_duration, in_range, in_range_or, non_empty, parse_go_bool, positive_go_duration,
    table_bytes,
};
use super::redis_address::{NodeSyntax, auth};
use super::tls::key_pair_files;
use super::{SettingsError, invalid};
use crate::secret::Secret;
use crate::store::allowance::AllowanceTuning;
use crate::store::redis::{
    Credentials, RedisConfig, RedisTarget, RedisTls, RedisTopology, StartupBackoff,
    read_credentials,
};

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
        let tls = self.shared_tls()?;
        let main = target(&self.main_vars(tls.as_ref()))?;
        let per_second = if self.redis_persecond {
            Some(target(&self.per_second_vars(tls.as_ref()))?)
        } else {
            None
        };
        let timeout = positive_go_duration("REDIS_TIMEOUT", &self.redis_timeout, "250ms or 1s")?;
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
        let ms = in_range(
            "SLUICE_REDIS_ALLOWANCE_HORIZON_MS",
            self.redis_allowance_horizon_ms,
            10..=10_000,
        )?;
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
        let ms = in_range_or(
            "SLUICE_LOCAL_CACHE_MAX_AGE_MS",
            self.local_cache_max_age_ms,
            &(1..=MAX_MS),
            format_args!("must be between 1 and {MAX_MS} (a year)"),
        )?;
        Ok(Duration::from_millis(ms))
    }

    /// The REDIS_TLS_* files, read when REDIS_TLS or REDIS_PERSECOND_TLS is on: one set of files
    /// serves both Redis, as in Go (there is no REDIS_PERSECOND_TLS_CACERT). Without either they
    /// are not read, as in Go.
    fn shared_tls(&self) -> Result<Option<RedisTls>, SettingsError> {
        if self.redis_tls || self.redis_persecond_tls {
            self.tls().map(Some)
        } else {
            Ok(None)
        }
    }

    /// REDIS_URL's variables.
    fn main_vars<'a>(&'a self, tls: Option<&'a RedisTls>) -> RedisVars<'a> {
        RedisVars {
            url: Named::new("REDIS_URL", self.redis_url.as_deref()),
            socket_type: Named::new("REDIS_SOCKET_TYPE", self.redis_socket_type.as_str()),
            redis_type: Named::new("REDIS_TYPE", self.redis_type.as_str()),
            auth: Named::new("REDIS_AUTH", &self.redis_auth),
            auth_file: Named::new("REDIS_AUTH_FILE", self.redis_auth_file.as_deref()),
            sentinel_auth: Named::new("REDIS_SENTINEL_AUTH", &self.redis_sentinel_auth),
            sentinel_auth_file: Named::new(
                "REDIS_SENTINEL_AUTH_FILE",
                self.redis_sentinel_auth_file.as_deref(),
            ),
            tls: Named::new("REDIS_TLS", tls.filter(|_| self.redis_tls)),
        }
    }

    /// REDIS_PERSECOND_URL's variables.
    fn per_second_vars<'a>(&'a self, tls: Option<&'a RedisTls>) -> RedisVars<'a> {
        RedisVars {
            url: Named::new("REDIS_PERSECOND_URL", self.redis_persecond_url.as_deref()),
            socket_type: Named::new(
                "REDIS_PERSECOND_SOCKET_TYPE",
                self.redis_persecond_socket_type.as_str(),
            ),
            redis_type: Named::new("REDIS_PERSECOND_TYPE", self.redis_persecond_type.as_str()),
            auth: Named::new("REDIS_PERSECOND_AUTH", &self.redis_persecond_auth),
            auth_file: Named::new(
                "REDIS_PERSECOND_AUTH_FILE",
                self.redis_persecond_auth_file.as_deref(),
            ),
            sentinel_auth: Named::new(
                "REDIS_PERSECOND_SENTINEL_AUTH",
                &self.redis_persecond_sentinel_auth,
            ),
            sentinel_auth_file: Named::new(
                "REDIS_PERSECOND_SENTINEL_AUTH_FILE",
                self.redis_persecond_sentinel_auth_file.as_deref(),
            ),
            tls: Named::new(
                "REDIS_PERSECOND_TLS",
                tls.filter(|_| self.redis_persecond_tls),
            ),
        }
    }

    /// The Go service's pool and pipeline settings, which mean nothing to one multiplexed
    /// connection, are still checked for syntax, and an empty pool may only wait.
    fn check_pool_settings(&self) -> Result<(), SettingsError> {
        go_duration(
            "REDIS_PIPELINE_WINDOW",
            &self.redis_pipeline_window,
            "0 or 150us",
        )?;
        go_duration(
            "REDIS_PERSECOND_PIPELINE_WINDOW",
            &self.redis_persecond_pipeline_window,
            "0 or 150us",
        )?;
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
        let positive = |var, value| positive_go_duration(var, value, "1s");
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
        let max_elapsed = go_duration(
            "REDIS_STARTUP_MAX_ELAPSED_TIME",
            &self.redis_startup_max_elapsed_time,
            "0 (retry forever) or 5m",
        )?;
        Ok(StartupBackoff {
            initial,
            max,
            max_elapsed: (!max_elapsed.is_zero()).then_some(max_elapsed),
        })
    }

    /// Reads the REDIS_TLS_* files and checks them as the other TLS clients' are, so a missing,
    /// unreadable or mismatched file stops start-up with a message naming it (Go panics).
    pub(super) fn tls(&self) -> Result<RedisTls, SettingsError> {
        use crate::tls::{ClientTls, PemFile};
        let identity = key_pair_files(
            Named::new("REDIS_TLS_CLIENT_CERT", self.redis_tls_client_cert.as_str()),
            Named::new("REDIS_TLS_CLIENT_KEY", self.redis_tls_client_key.as_str()),
        )?;
        let client = ClientTls::from_files(
            non_empty(Some(&self.redis_tls_cacert)).map(|p| PemFile::new("REDIS_TLS_CACERT", p)),
            identity,
            None,
        )?;
        Ok(RedisTls {
            ca_pem: client.ca_pem,
            client_pem: client.identity_pem,
            skip_hostname_verification: self.redis_tls_skip_hostname_verification,
        })
    }
}

/// One Redis's variables, each with its name: REDIS_* for the main one, REDIS_PERSECOND_* for
/// the per-second one.
struct RedisVars<'a> {
    url: Named<Option<&'a str>>,
    socket_type: Named<&'a str>,
    redis_type: Named<&'a str>,
    auth: Named<&'a Secret>,
    auth_file: Named<Option<&'a Path>>,
    sentinel_auth: Named<&'a Secret>,
    sentinel_auth_file: Named<Option<&'a Path>>,
    tls: Named<Option<&'a RedisTls>>,
}

/// One Redis's target, with its credential files.
fn target(vars: &RedisVars<'_>) -> Result<RedisTarget, SettingsError> {
    let target = redis_target(vars)?;
    with_credential_files(target, vars)
}

/// A target with its credential files: the auth file's for its nodes (a Sentinel group's
/// master), the sentinel one's for a Sentinel group's sentinels.
fn with_credential_files(
    mut target: RedisTarget,
    vars: &RedisVars<'_>,
) -> Result<RedisTarget, SettingsError> {
    let auth = credentials_file(vars.auth, vars.auth_file)?;
    let sentinel_auth = credentials_file(vars.sentinel_auth, vars.sentinel_auth_file)?;
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
    auth: Named<&Secret>,
    file: Named<Option<&Path>>,
) -> Result<Credentials, SettingsError> {
    let Some(path) = file.value.filter(|p| !p.as_os_str().is_empty()) else {
        return Ok(Credentials::Fixed);
    };
    let (auth_var, file_var) = (auth.var, file.var);
    let shown = path.display();
    if !auth.value.is_empty() {
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
fn redis_target(vars: &RedisVars<'_>) -> Result<RedisTarget, SettingsError> {
    let (url_var, socket_var, tls_var) = (vars.url.var, vars.socket_type.var, vars.tls.var);
    let (socket_type, redis_auth) = (vars.socket_type.value, vars.auth.value);
    let tls = vars.tls.value.cloned();
    let Some(url) = vars.url.value.filter(|u| !u.trim().is_empty()) else {
        return Err(invalid(url_var, "", "required for the Redis backend"));
    };
    let mut items: Vec<&str> = url
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    let topology = topology(
        Named::new(url_var, url),
        &mut items,
        vars.redis_type,
        redis_auth,
    )?;
    let unix = match socket_type.to_ascii_lowercase().as_str() {
        "tcp" => false,
        "unix" => topology == RedisTopology::Single,
        _ => return Err(invalid(socket_var, socket_type, "expected tcp or unix")),
    };
    // The items' credentials: the sentinels' for sentinels, else REDIS_AUTH.
    let items_auth = match topology {
        RedisTopology::Sentinel { .. } => auth(vars.sentinel_auth.value.expose()),
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
    url: Named<&str>,
    items: &mut Vec<&str>,
    redis_type: Named<&str>,
    redis_auth: &Secret,
) -> Result<RedisTopology, SettingsError> {
    let (url_var, url) = (url.var, url.value);
    let (type_var, redis_type) = (redis_type.var, redis_type.value);
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
mod tests;
