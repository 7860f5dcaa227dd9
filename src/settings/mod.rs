//! Command-line flags and the envoyproxy/ratelimit environment variables, validated once at startup.
//!
//! Every setting is a flag that can also come from the environment variable the Go service reads
//! (`--port` / `PORT`), so an existing deployment keeps working by swapping the image. A flag beats
//! its variable; an empty variable counts as unset, as `os.Getenv` plus a default does in Go.
//!
//! Parsing happens in two steps, as the rest of Sluice does with config:
//!
//! 1. [`parse_cli_from`] turns argv + environment into [`Cli`], whose [`ServeArgs`] are raw values
//!    (strings, plain integers). Errors here are clap errors, rewritten to name the variable.
//! 2. [`ServeArgs::validate`] turns them into [`Settings`]: resolved socket addresses, enums,
//!    non-zero limits and durations. Errors are [`SettingsError`]s naming the variable and value.
//!
//! `main` does both before binding any port, so a typo fails fast with exit code 64 instead of
//! surfacing as a half-started service.
//!
//! Differences from the Go service, on purpose:
//!
//! - There is no default `RUNTIME_ROOT` (Go: `/srv/runtime_data/current`); without `--config` or
//!   `RUNTIME_ROOT`, Sluice reads `./config`.
//! - `BACKEND_TYPE` defaults to `memory`. Because a memory backend counts per node, a set
//!   `REDIS_URL` without `BACKEND_TYPE` is an error rather than a silent change of semantics.
//! - Booleans parse exactly like Go's `strconv.ParseBool`, but a bad value is an error where Go
//!   would panic or fall back to the default.
//! - `NEAR_LIMIT_RATIO` and the header names are checked; Go accepts anything.
//! - The REDIS_TLS_* files are read and parsed here, so a missing file, a certificate without
//!   its key or a key that does not fit stops start-up naming the variable and the file (Go
//!   panics, or ignores a certificate without its key).

//!
//! One file per subsystem turns its variables into the configuration type that subsystem owns
//! (store, cluster, xds, telemetry, tls, ...); `ServeArgs::validate` composes them into the
//! app's options ([`AppOptions`]) and what `main` does before it builds the app. Nothing outside
//! `main` imports this module.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Parser, Subcommand};

use crate::app::{AppOptions, Backend};
use crate::config::{ConfigSource, FileLimits, LoadOptions};
use crate::rlqs::RlqsOptions;
use crate::service::{NegativeHits, ServiceOptions};
use crate::telemetry::{LogFormat, LogLevel};
use crate::tls::{GrpcTlsFiles, PeerTlsFiles};
use crate::xds::XdsConfig;

mod addrs;
mod backend;
pub(crate) mod caps;
mod cli;
mod cluster;
mod compat;
mod config_files;
mod env_names;
mod headers;
mod listeners;
mod memcache;
mod otlp;
mod parse;
mod peer_tls;
mod redis;
mod redis_address;
mod redis_breaker;
pub mod rlqs;
mod runtime_limits;
mod spoa;
mod telemetry;
mod tls;
mod xds;

pub(crate) use self::redis::RedisArgs;
use addrs::{check_distinct, resolve_listener};
use backend::{CounterStore, counter_store};
pub use cli::{parse_cli, parse_cli_from};
pub(crate) use cluster::ClusterArgs;
pub(crate) use compat::CompatArgs;
pub use env_names::TOOL_VARIABLES;
pub(crate) use listeners::ListenerArgs;
pub(crate) use memcache::MemcacheArgs;
pub(crate) use parse::parse_go_bool;
use parse::{Named, in_range, non_zero};
pub(crate) use redis_breaker::RedisBreakerArgs;
pub(crate) use telemetry::TelemetryArgs;
use telemetry::{log_format, log_level};
pub(crate) use tls::GrpcTlsArgs;
pub(crate) use xds::XdsArgs;

/// The whole command line: `sluice [FLAGS]` serves, `sluice check-config PATH` validates config.
#[derive(Debug, Parser)]
#[command(
    name = "sluice",
    version,
    about = "An external rate-limit service for Envoy and nginx, drop-in compatible with envoyproxy/ratelimit",
    long_about = None
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate a config file or directory, print every error, exit 1 on failure.
    CheckConfig {
        /// A YAML file, or a directory whose YAML files are read like the service reads them.
        path: PathBuf,
        /// Allow several files to declare the same domain and merge their descriptors.
        #[arg(
            long,
            env = "MERGE_DOMAIN_CONFIG",
            value_name = "BOOL",
            action = ArgAction::Set,
            num_args = 0..=1,
            require_equals = true,
            default_missing_value = "true",
            default_value = "false",
            value_parser = parse_go_bool,
        )]
        merge_domain_config: bool,
        /// Also fail on every use of Sluice's YAML extensions (`algorithm`, `burst`,
        /// `rate_limits`), for files that must stay loadable by envoyproxy/ratelimit.
        #[arg(
            long,
            value_name = "BOOL",
            action = ArgAction::Set,
            num_args = 0..=1,
            require_equals = true,
            default_missing_value = "true",
            default_value = "false",
            value_parser = parse_go_bool,
        )]
        strict_envoy: bool,
        /// Also fail on every limit no `rate_limit_quota` bucket can reach (a path that repeats
        /// a key, or nests keys in another order than buckets map to: SLUICE_RLQS_KEY_ORDER,
        /// then bytewise), for configs that serve Envoy's quota filter.
        #[arg(
            long,
            value_name = "BOOL",
            action = ArgAction::Set,
            num_args = 0..=1,
            require_equals = true,
            default_missing_value = "true",
            default_value = "false",
            value_parser = parse_go_bool,
        )]
        rlqs: bool,
    },
    /// Check that a running Sluice answers (what the Helm chart's test hook runs): its HTTP
    /// port answers /healthcheck with 200 and a rate-limit request on /json. Exits 0 when it
    /// does, 1 otherwise.
    Probe {
        /// The HTTP port (PORT) as `host:port`.
        #[arg(long, value_name = "HOST:PORT")]
        address: String,
    },
    /// Explain what Sluice decides for a request, step by step, without counting: which config
    /// node matched each entry and how, the limit, `replaces`, shadow and quota mode, the
    /// counter keys; against a running Sluice (`--debug-address`) also each counter's state and
    /// the answer the request would get. Exits 0 when explained, 1 when the request or the
    /// config is refused, 64 for bad flags.
    Explain {
        /// A config file or directory to explain against (counters are not read).
        #[arg(
            long,
            conflicts_with = "debug_address",
            required_unless_present = "debug_address"
        )]
        config: Option<PathBuf>,
        /// A running Sluice's debug port (`host:port`, DEBUG_PORT), whose /debug/explain answers
        /// with the counters it holds.
        #[arg(long, value_name = "HOST:PORT")]
        debug_address: Option<String>,
        /// The request's domain.
        #[arg(long, required_unless_present = "request")]
        domain: Option<String>,
        /// One descriptor as `key=value&key2=value2` (the `/nginx` and `/forward-auth` syntax);
        /// repeat for several.
        #[arg(long, required_unless_present = "request")]
        descriptor: Vec<String>,
        /// The request's hits_addend (0 means 1, as in the Go service).
        #[arg(long, default_value_t = 0)]
        hits_addend: u32,
        /// The request as a `/json` body (overrides and per-descriptor hits_addend included),
        /// from this file, or `-` for standard input; instead of --domain and --descriptor.
        #[arg(long, value_name = "PATH", conflicts_with_all = ["domain", "descriptor", "hits_addend"])]
        request: Option<PathBuf>,
        /// Print the JSON that /debug/explain answers instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Raw serve flags, as typed by the operator. Call [`ServeArgs::validate`] to use them.
///
/// Boolean flags take an optional value: `--shadow-mode` means true, `--shadow-mode=false` false.
/// The `=` is required so that a following argument is never swallowed as the value.
#[derive(Clone, Debug, clap::Args)]
pub struct ServeArgs {
    /// Address of the HTTP listener (/json, /healthcheck); an IP or a resolvable host name.
    #[arg(
        long,
        env = "HOST",
        default_value = "0.0.0.0",
        help_heading = "Listeners"
    )]
    pub host: String,
    /// Port of the HTTP listener; 0 picks a free port.
    #[arg(long, env = "PORT", default_value_t = 8080, help_heading = "Listeners")]
    pub port: u16,
    /// Address of the gRPC listener (envoy.service.ratelimit.v3, grpc.health.v1).
    #[arg(
        long,
        env = "GRPC_HOST",
        default_value = "0.0.0.0",
        help_heading = "Listeners"
    )]
    pub grpc_host: String,
    /// Port of the gRPC listener; 0 picks a free port.
    #[arg(
        long,
        env = "GRPC_PORT",
        default_value_t = 8081,
        help_heading = "Listeners"
    )]
    pub grpc_port: u16,
    /// Address of the debug listener (metrics, config dump).
    #[arg(
        long,
        env = "DEBUG_HOST",
        default_value = "0.0.0.0",
        help_heading = "Listeners"
    )]
    pub debug_host: String,
    /// Port of the debug listener; 0 picks a free port.
    #[arg(
        long,
        env = "DEBUG_PORT",
        default_value_t = 6070,
        help_heading = "Listeners"
    )]
    pub debug_port: u16,

    /// Config file or directory; wins over RUNTIME_ROOT. Default: ./config when neither is set.
    #[arg(long, env = "SLUICE_CONFIG", help_heading = "Config source")]
    pub config: Option<PathBuf>,
    /// Runtime root, as in the Go service; config is read from
    /// ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY. Unlike Go there is no default.
    #[arg(long, env = "RUNTIME_ROOT", help_heading = "Config source")]
    pub runtime_root: Option<PathBuf>,
    /// Subdirectory of RUNTIME_ROOT holding the application directory.
    #[arg(long, env = "RUNTIME_SUBDIRECTORY", help_heading = "Config source")]
    pub runtime_subdirectory: Option<String>,
    /// Directory below RUNTIME_ROOT/RUNTIME_SUBDIRECTORY holding the YAML files.
    #[arg(
        long,
        env = "RUNTIME_APPDIRECTORY",
        default_value = "config",
        help_heading = "Config source"
    )]
    pub runtime_appdirectory: String,
    /// Accepted for compatibility. Sluice polls the resolved config directory itself, which
    /// also notices a symlink swap of the root, so there is nothing to choose.
    #[arg(
        long,
        env = "RUNTIME_WATCH_ROOT",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "true",
        value_parser = parse_go_bool,
        help_heading = "Config source"
    )]
    pub runtime_watch_root: bool,
    /// Accepted for compatibility. Files whose names start with a dot are always ignored, which
    /// keeps editor swap files and Kubernetes ConfigMap `..data` links out of the config.
    #[arg(
        long,
        env = "RUNTIME_IGNOREDOTFILES",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Config source"
    )]
    pub runtime_ignoredotfiles: bool,
    /// Allow several files to declare the same domain and merge their descriptors.
    #[arg(
        long,
        env = "MERGE_DOMAIN_CONFIG",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Config source"
    )]
    pub merge_domain_config: bool,
    /// Start (and report healthy) even if the initial config fails to load.
    #[arg(
        long,
        env = "FORCE_START_WITHOUT_INITIAL_CONFIG",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Config source"
    )]
    pub force_start_without_initial_config: bool,
    /// Report healthy only once at least one config has loaded.
    #[arg(
        long,
        env = "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Config source"
    )]
    pub healthy_with_at_least_one_config_loaded: bool,

    /// Count as usual but answer OK to every request (per-descriptor statuses keep OVER_LIMIT).
    #[arg(
        long,
        env = "SHADOW_MODE",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Behaviour"
    )]
    pub shadow_mode: bool,
    /// Let quota-mode limits report OVER_LIMIT per descriptor without failing the request.
    #[arg(
        long,
        env = "QUOTA_MODE",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Behaviour"
    )]
    pub quota_mode: bool,
    /// Return the request's descriptors as dynamic metadata in the gRPC response.
    #[arg(
        long,
        env = "RESPONSE_DYNAMIC_METADATA",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Behaviour"
    )]
    pub response_dynamic_metadata: bool,
    /// Fraction of a limit at which hits count as near the limit (stats only); in (0, 1].
    #[arg(
        long,
        env = "NEAR_LIMIT_RATIO",
        default_value_t = 0.8,
        help_heading = "Behaviour"
    )]
    pub near_limit_ratio: f32,
    /// Prefix of every counter key, e.g. to share a Redis between services.
    #[arg(long, env = "CACHE_KEY_PREFIX", help_heading = "Behaviour")]
    pub cache_key_prefix: Option<String>,

    #[command(flatten)]
    pub headers: headers::HeaderArgs,

    /// trace, debug, info, warn (or warning), error; fatal and panic mean error. Any case.
    #[arg(
        long,
        env = "LOG_LEVEL",
        default_value = "WARN",
        help_heading = "Logging"
    )]
    pub log_level: String,
    /// text or json.
    #[arg(
        long,
        env = "LOG_FORMAT",
        default_value = "text",
        help_heading = "Logging"
    )]
    pub log_format: String,
    #[command(flatten)]
    pub telemetry: TelemetryArgs,

    #[command(flatten)]
    pub grpc_tls: GrpcTlsArgs,

    /// Counter store: `memory` (counts per node; the default), `redis` or `memcache` (shared
    /// counters, keyed like envoyproxy/ratelimit). Unset with REDIS_URL set means `redis`.
    #[arg(long, env = "BACKEND_TYPE", help_heading = "Backend")]
    pub backend_type: Option<String>,
    #[command(flatten)]
    pub redis: RedisArgs,
    #[command(flatten)]
    pub memcache: MemcacheArgs,
    /// What a request gets when the backend fails: `error` answers gRPC UNKNOWN (HTTP 400 on
    /// /json), as envoyproxy/ratelimit does with Redis, and Envoy's failure_mode_deny decides;
    /// `allow` answers OK (fail open). Unset: `allow` with BACKEND_TYPE=memcache (the Go
    /// service's memcache backend only logs its errors), else `error`.
    #[arg(long, env = "SLUICE_BACKEND_FAILURE", help_heading = "Backend")]
    pub backend_failure: Option<String>,
    /// Comma-separated domains that fail open (answer OK) when the backend fails, whatever
    /// SLUICE_BACKEND_FAILURE says.
    #[arg(
        long,
        env = "SLUICE_FAIL_OPEN_DOMAINS",
        default_value = "",
        help_heading = "Backend"
    )]
    pub fail_open_domains: String,
    /// Which refunds (descriptors with `is_negative_hits`) take hits off their counters:
    /// `counted` only on limits that count refused hits (a fixed window, as envoyproxy/ratelimit
    /// counts, where nothing holds refused hits back; any limit with `charge_refused: true`),
    /// since Envoy sends the refund for refused requests too; `always` on every limit, as
    /// envoyproxy/ratelimit does.
    #[arg(
        long,
        env = "SLUICE_NEGATIVE_HITS",
        default_value = "counted",
        help_heading = "Backend"
    )]
    pub negative_hits: String,

    /// Cap on live in-memory counters; past it, new keys are refused until the sweeper frees
    /// expired ones, so memory stays bounded under a flood of distinct descriptors.
    #[arg(
        long,
        env = "SLUICE_MAX_COUNTERS",
        default_value_t = 1_000_000,
        help_heading = "Sluice limits"
    )]
    pub max_counters: usize,
    /// Most descriptors accepted in one request.
    #[arg(
        long,
        env = "SLUICE_MAX_DESCRIPTORS",
        default_value_t = 64,
        help_heading = "Sluice limits"
    )]
    pub max_descriptors: usize,
    /// Most entries accepted in one descriptor.
    #[arg(
        long,
        env = "SLUICE_MAX_ENTRIES",
        default_value_t = 32,
        help_heading = "Sluice limits"
    )]
    pub max_entries: usize,
    /// Largest request body accepted, in bytes (gRPC message or /json body).
    #[arg(
        long,
        env = "SLUICE_MAX_REQUEST_BYTES",
        default_value_t = 65536,
        help_heading = "Sluice limits"
    )]
    pub max_request_bytes: usize,
    /// How often the config source is checked for changes, in milliseconds (10..=60000).
    #[arg(
        long,
        env = "SLUICE_CONFIG_POLL_MS",
        default_value_t = 500,
        help_heading = "Sluice limits"
    )]
    pub config_poll_ms: u64,
    /// How often expired counters are swept from memory, in seconds (at least 1).
    #[arg(
        long,
        env = "SLUICE_SWEEP_INTERVAL_SECS",
        default_value_t = 10,
        help_heading = "Sluice limits"
    )]
    pub sweep_interval_secs: u64,
    /// After SIGTERM, how long in-flight requests may finish before exit, in seconds; 0 exits
    /// at once. Health checks report unhealthy during the drain.
    #[arg(
        long,
        env = "SLUICE_DRAIN_TIMEOUT_SECS",
        default_value_t = 15,
        help_heading = "Sluice limits"
    )]
    pub drain_timeout_secs: u64,
    /// After SIGTERM, how long to keep serving with health failing before the listeners stop
    /// accepting, in seconds, so load balancers (a Kubernetes Service) stop sending new calls
    /// first. 0 stops accepting at once.
    #[arg(
        long,
        env = "SLUICE_SHUTDOWN_DELAY_SECS",
        default_value_t = 0,
        help_heading = "Sluice limits"
    )]
    pub shutdown_delay_secs: u64,
    /// Allows `POST /debug/counters/reset` on the debug port, which resets a request's
    /// counters. Off by default: the debug port has no authentication.
    #[arg(
        long,
        env = "SLUICE_DEBUG_COUNTER_RESET",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Listeners"
    )]
    pub debug_counter_reset: bool,

    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub xds: XdsArgs,
    #[command(flatten)]
    pub compat: CompatArgs,
    #[command(flatten)]
    pub listeners: ListenerArgs,
    #[command(flatten)]
    pub peer_tls: peer_tls::PeerTlsArgs,
    #[command(flatten)]
    pub caps: caps::CapsArgs,
    #[command(flatten)]
    pub config_files: config_files::ConfigFileArgs,
    #[command(flatten)]
    pub redis_breaker: RedisBreakerArgs,
    #[command(flatten)]
    pub rlqs: rlqs::RlqsArgs,
    #[command(flatten)]
    pub spoa: spoa::SpoaArgs,
    #[command(flatten)]
    pub runtime_limits: runtime_limits::RuntimeLimitsArgs,
}

/// Validated settings: the app's options, built here whole, and what `main` does with the rest
/// before it builds the app (logs, the config's first load, the TLS files read, the ports bound).
#[derive(Clone, Debug)]
pub struct Settings {
    /// Everything [`App`](crate::app::App) needs but what `main` reads from files after these
    /// checks: the config feed and the TLS material. Here `reload`, `xds`, `grpc_tls` and
    /// `peer_tls` are `None`; `main` fills them from [`Settings::config`] and the files below.
    pub app: AppOptions,
    /// Where each listener binds.
    pub addrs: Addrs,
    /// Where the rate-limit config comes from, and how it is read.
    pub config: ConfigSettings,
    pub log_level: LogLevel,
    pub log_format: LogFormat,
    /// GRPC_SERVER_USE_TLS's files; `None` serves gRPC in clear.
    pub grpc_tls: Option<GrpcTlsFiles>,
    /// SLUICE_PEER_TLS's files; `None`: the peer port and the calls to peers are plain text.
    pub peer_tls: Option<PeerTlsFiles>,
}

/// The listeners' addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Addrs {
    /// HOST:PORT.
    pub http: SocketAddr,
    /// GRPC_HOST:GRPC_PORT.
    pub grpc: SocketAddr,
    /// GRPC_UDS: gRPC on this unix socket instead of `grpc`.
    pub grpc_uds: Option<PathBuf>,
    /// DEBUG_HOST:DEBUG_PORT.
    pub debug: SocketAddr,
    /// USE_PROMETHEUS: where the exposition gets its own listener.
    pub prometheus: Option<SocketAddr>,
    /// SPOA_HOST:SPOA_PORT: HAProxy's SPOE agent, when SPOA_PORT is set.
    pub spoa: Option<SocketAddr>,
}

/// Where the rate-limit config comes from, and how it is read.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigSettings {
    /// `--config` / SLUICE_CONFIG, the runtime layout, or `./config`.
    pub source: ConfigSource,
    /// MERGE_DOMAIN_CONFIG.
    pub load: LoadOptions,
    /// SLUICE_CONFIG_MAX_FILE_BYTES, _MAX_TOTAL_BYTES and _SETTLE_MS.
    pub files: FileLimits,
    /// SLUICE_CONFIG_POLL_MS: between 10 ms and 60 s.
    pub poll_interval: Duration,
    /// FORCE_START_WITHOUT_INITIAL_CONFIG.
    pub force_start: bool,
    /// `Some` with CONFIG_TYPE=GRPC_XDS_SOTW: the config comes from an xDS server, not files.
    pub xds: Option<XdsConfig>,
}

/// The three listeners every Sluice has.
#[derive(Clone, Copy)]
struct ListenAddrs {
    http: SocketAddr,
    grpc: SocketAddr,
    debug: SocketAddr,
}

impl ListenAddrs {
    /// Each address with the port variable an error about it names.
    fn named(self) -> [Named<SocketAddr>; 3] {
        [
            Named::new("PORT", self.http),
            Named::new("GRPC_PORT", self.grpc),
            Named::new("DEBUG_PORT", self.debug),
        ]
    }
}

/// A setting that cannot be used. Every message names the variable and, where there is one, the
/// offending value, since the operator most likely set it through the environment.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("{var}={value}: {reason}")]
    Invalid {
        var: &'static str,
        value: String,
        reason: String,
    },
    #[error("{var}={host}: cannot resolve host: {source}")]
    Resolve {
        var: &'static str,
        host: String,
        #[source]
        source: io::Error,
    },
    #[error("{var}={value}: {reason}; Sluice does not support it yet")]
    NotSupportedYet {
        var: &'static str,
        value: String,
        reason: &'static str,
    },
    /// A TLS file that cannot be used; the message names the variable and the file.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
}

fn invalid(
    var: &'static str,
    value: impl fmt::Display,
    reason: impl Into<String>,
) -> SettingsError {
    SettingsError::Invalid {
        var,
        value: value.to_string(),
        reason: reason.into(),
    }
}

impl ServeArgs {
    /// Check every value and convert it to its typed form. Host names are resolved here, once,
    /// so a name that does not resolve stops startup instead of failing at bind time.
    pub fn validate(self) -> Result<Settings, SettingsError> {
        let ListenAddrs { http, grpc, debug } = self.listen_addrs()?;
        let near_limit_ratio = near_limit_ratio(self.near_limit_ratio)?;
        let grpc_tls = self.grpc_tls.validate()?;
        let headers = self.headers.validate()?;
        let CounterStore { backend, cluster } = counter_store(&self, grpc)?;
        let config = self.config_settings(&backend)?;
        let peer_tls = self.peer_tls.validate(cluster.is_some())?;
        let grpc_connection_age = self.compat.validate()?;
        let grpc_uds = self.compat.grpc_uds(self.grpc_tls.grpc_server_use_tls)?;
        let log_level = log_level(&self.log_level)?;
        let log_format = log_format(&self.log_format)?;
        let mut telemetry = self.telemetry.validate(near_limit_ratio)?;
        telemetry.stats.response_time_in_millis =
            self.compat.prometheus_response_time_as_milliseconds;
        let prometheus = self.telemetry.prometheus_addr()?;
        let max_counters = non_zero("SLUICE_MAX_COUNTERS", self.max_counters)?.get();
        let caps = self.caps.validate()?;
        let service = self.service_options(headers, caps.max_key_bytes.get(), &backend)?;
        let max_request_bytes = non_zero("SLUICE_MAX_REQUEST_BYTES", self.max_request_bytes)?.get();
        let xds = self.xds.validate()?;
        let listener_limits = self.listeners.validate(self.max_request_bytes)?;
        let spoa = self
            .spoa
            .validate(&ListenAddrs { http, grpc, debug }.named())?;
        let quota = self.rlqs.validate(RlqsOptions {
            shadow_mode: service.shadow_mode,
            max_entries: service.max_entries,
            max_key_bytes: service.max_key_bytes,
            ..RlqsOptions::default()
        })?;
        let config = ConfigSettings { xds, ..config };
        let app = AppOptions {
            service,
            max_counters,
            max_counter_bytes: caps.max_counter_bytes.get(),
            counter_reset: self.debug_counter_reset,
            sweep_interval: Duration::from_secs(self.sweep_interval_secs),
            max_request_bytes,
            require_config_for_health: self.healthy_with_at_least_one_config_loaded,
            shutdown_delay: Duration::from_secs(self.shutdown_delay_secs),
            drain_timeout: Duration::from_secs(self.drain_timeout_secs),
            reload: None,
            backend,
            cluster,
            xds: None,
            telemetry,
            grpc_tls: None,
            grpc_connection_age,
            listener_limits,
            peer_tls: None,
            quota,
            spoa: spoa.as_ref().map(|s| s.options),
            runtime_limits: self.runtime_limits.validate()?,
        };
        Ok(Settings {
            app,
            addrs: Addrs {
                http,
                grpc,
                grpc_uds,
                debug,
                prometheus,
                spoa: spoa.map(|s| s.addr),
            },
            config,
            log_level,
            log_format,
            grpc_tls,
            peer_tls,
        })
    }

    /// Where the configuration comes from, how it is loaded for `backend` and how it is watched
    /// (xDS set by the caller, whose validation takes its settings).
    fn config_settings(&self, backend: &Backend) -> Result<ConfigSettings, SettingsError> {
        Ok(ConfigSettings {
            source: self.config_source(),
            load: load_options(
                self.merge_domain_config,
                self.compat.use_calendar_month_rate_limit,
                backend,
            ),
            files: self.config_files.validate()?,
            poll_interval: self.poll_interval()?,
            force_start: self.force_start_without_initial_config,
            xds: None,
        })
    }

    /// HOST:PORT, GRPC_HOST:GRPC_PORT and DEBUG_HOST:DEBUG_PORT, on distinct addresses.
    fn listen_addrs(&self) -> Result<ListenAddrs, SettingsError> {
        let addrs = ListenAddrs {
            http: resolve_listener("HOST", &self.host, self.port)?,
            grpc: resolve_listener("GRPC_HOST", &self.grpc_host, self.grpc_port)?,
            debug: resolve_listener("DEBUG_HOST", &self.debug_host, self.debug_port)?,
        };
        check_distinct(&addrs.named())?;
        Ok(addrs)
    }

    /// `--config`, else the Go service's runtime layout under RUNTIME_ROOT, else `./config`.
    fn config_source(&self) -> ConfigSource {
        match (&self.config, &self.runtime_root) {
            (Some(path), _) => ConfigSource::Path(path.clone()),
            (None, Some(root)) => ConfigSource::Runtime {
                root: root.clone(),
                subdirectory: self.runtime_subdirectory.clone().unwrap_or_default(),
                app_directory: self.runtime_appdirectory.clone(),
            },
            (None, None) => ConfigSource::Path(PathBuf::from("./config")),
        }
    }

    /// SLUICE_CONFIG_POLL_MS, checked with SLUICE_SWEEP_INTERVAL_SECS (both timers).
    fn poll_interval(&self) -> Result<Duration, SettingsError> {
        let config_poll_ms = in_range("SLUICE_CONFIG_POLL_MS", self.config_poll_ms, 10..=60_000)?;
        if self.sweep_interval_secs == 0 {
            return Err(invalid(
                "SLUICE_SWEEP_INTERVAL_SECS",
                0,
                "must be at least 1",
            ));
        }
        Ok(Duration::from_millis(config_poll_ms))
    }

    /// The decision's options; `max_key_bytes` (SLUICE_MAX_KEY_BYTES) is checked with the
    /// other byte cap, in [`caps`].
    fn service_options(
        &self,
        headers: headers::Headers,
        max_key_bytes: usize,
        backend: &Backend,
    ) -> Result<ServiceOptions, SettingsError> {
        let fail_open = match self.backend_failure.as_deref().map(str::to_ascii_lowercase) {
            None => matches!(backend, Backend::Memcache(_)),
            Some(v) if v == "error" => false,
            Some(v) if v == "allow" => true,
            Some(v) => {
                return Err(invalid(
                    "SLUICE_BACKEND_FAILURE",
                    v,
                    "expected error or allow",
                ));
            }
        };
        Ok(ServiceOptions {
            shadow_mode: self.shadow_mode,
            quota_mode: self.quota_mode,
            response_headers: headers.response,
            request_headers: headers.request,
            all_descriptors_headers: headers.all_descriptors,
            cache_key_prefix: self.cache_key_prefix.clone().unwrap_or_default(),
            dynamic_metadata: self.response_dynamic_metadata,
            fail_open,
            fail_open_domains: self
                .fail_open_domains
                .split(',')
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .map(str::to_owned)
                .collect(),
            max_descriptors: non_zero("SLUICE_MAX_DESCRIPTORS", self.max_descriptors)?.get(),
            max_entries: non_zero("SLUICE_MAX_ENTRIES", self.max_entries)?.get(),
            max_key_bytes,
            negative_hits: NegativeHits::from_name(self.negative_hits.trim()).ok_or_else(|| {
                invalid(
                    "SLUICE_NEGATIVE_HITS",
                    &self.negative_hits,
                    "expected counted or always",
                )
            })?,
        })
    }
}

/// NEAR_LIMIT_RATIO, in (0, 1]. `!(x > 0)` rather than `x <= 0` so that NaN is rejected too.
fn near_limit_ratio(ratio: f32) -> Result<f32, SettingsError> {
    if !(ratio > 0.0 && ratio <= 1.0) {
        return Err(invalid(
            "NEAR_LIMIT_RATIO",
            ratio,
            "must be greater than 0 and at most 1",
        ));
    }
    Ok(ratio)
}

/// An HTTP field name is a non-empty RFC 9110 token; anything else would be rejected by the
/// HTTP library only when the first response is built.
fn header_name(var: &'static str, name: String) -> Result<String, SettingsError> {
    let is_tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || !name.bytes().all(is_tchar) {
        return Err(invalid(var, name, "not a valid HTTP header name"));
    }
    Ok(name)
}

/// The integration tests' throw-away CA, for the REDIS_TLS_* files.
#[cfg(test)]
use sluice_test_support::pki as test_pki;

/// How config files load for `backend`: MERGE_DOMAIN_CONFIG, USE_CALENDAR_MONTH_RATE_LIMIT, and a
/// store that keeps no slots (memcached) refusing `algorithm: concurrency` at load, before a
/// port is bound.
fn load_options(merge_domain_config: bool, calendar_month: bool, backend: &Backend) -> LoadOptions {
    LoadOptions {
        merge_domain_config,
        without_slots: matches!(backend, Backend::Memcache(_)).then_some("BACKEND_TYPE=memcache"),
        calendar_month,
    }
}

#[cfg(test)]
mod tests;
