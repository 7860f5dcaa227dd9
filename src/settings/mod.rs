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

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::Resettable;
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{ArgAction, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::app::{AppOptions, Backend};
use crate::cluster::ClusterConfig;
use crate::config::{ConfigSource, FileLimits, LoadOptions};
use crate::rlqs::QuotaOptions;
use crate::service::{NegativeHits, ServiceOptions};
use crate::telemetry::{LogFormat, LogLevel};
use crate::tls::{GrpcTlsFiles, PeerTlsFiles};
use crate::xds::XdsConfig;

pub(crate) mod caps;
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

pub use self::redis::RedisArgs;
use self::redis::backend;
pub use cluster::ClusterArgs;
pub use compat::CompatArgs;
pub use env_names::TOOL_VARIABLES;
pub use listeners::ListenerArgs;
pub use memcache::MemcacheArgs;
pub use otlp::OtlpArgs;
use parse::non_zero;
pub use parse::{InvalidBool, parse_go_bool, parse_go_duration};
pub use redis_breaker::RedisBreakerArgs;
pub use runtime_limits::RuntimeLimitsArgs;
pub use telemetry::TelemetryArgs;
use telemetry::{log_format, log_level};
pub use tls::GrpcTlsArgs;
pub use xds::XdsArgs;

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
        let (http, grpc, debug) = self.listen_addrs()?;
        let near_limit_ratio = near_limit_ratio(self.near_limit_ratio)?;
        let grpc_tls = self.grpc_tls.validate()?;
        let headers = self.headers.validate()?;
        let (backend, cluster) = self.backend_and_cluster(grpc)?;
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
        let spoa =
            self.spoa
                .validate(&[("PORT", http), ("GRPC_PORT", grpc), ("DEBUG_PORT", debug)])?;
        let quota = self.rlqs.validate(QuotaOptions {
            shadow_mode: service.shadow_mode,
            max_entries: service.max_entries,
            max_key_bytes: service.max_key_bytes,
            ..QuotaOptions::default()
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
            spoa: spoa.map(|(_, options)| options),
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
                spoa: spoa.map(|(addr, _)| addr),
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
    fn listen_addrs(&self) -> Result<(SocketAddr, SocketAddr, SocketAddr), SettingsError> {
        let http = resolve_listener("HOST", &self.host, self.port)?;
        let grpc = resolve_listener("GRPC_HOST", &self.grpc_host, self.grpc_port)?;
        let debug = resolve_listener("DEBUG_HOST", &self.debug_host, self.debug_port)?;
        check_distinct(&[("PORT", http), ("GRPC_PORT", grpc), ("DEBUG_PORT", debug)])?;
        Ok((http, grpc, debug))
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
        let config_poll_ms = self.config_poll_ms;
        if !(10..=60_000).contains(&config_poll_ms) {
            return Err(invalid(
                "SLUICE_CONFIG_POLL_MS",
                config_poll_ms,
                "must be between 10 and 60000",
            ));
        }
        if self.sweep_interval_secs == 0 {
            return Err(invalid(
                "SLUICE_SWEEP_INTERVAL_SECS",
                0,
                "must be at least 1",
            ));
        }
        Ok(Duration::from_millis(config_poll_ms))
    }

    /// The counter store, and the peer cluster (binding where the gRPC listener does).
    fn backend_and_cluster(
        &self,
        grpc: SocketAddr,
    ) -> Result<(Backend, Option<ClusterConfig>), SettingsError> {
        let cluster = self.cluster.validate()?;
        let write_behind = self.cluster.write_behind(
            self.backend_type.as_deref(),
            &self.redis,
            cluster.as_ref(),
            self.cache_key_prefix.as_deref().unwrap_or_default(),
        )?;
        let backend = match write_behind {
            // The cluster counts in memory; Redis only keeps the write-behind copy.
            Some(_) => Backend::Memory,
            None => backend(
                self.backend_type.as_deref(),
                self.redis.clone(),
                &self.memcache,
            )?,
        };
        let (backend, write_behind) = self.redis_breaker.apply(backend, write_behind)?;
        if let (Backend::Redis(_) | Backend::Memcache(_), Some(_)) = (&backend, &cluster) {
            return Err(self.cluster.peers_beside_shared_backend(&backend));
        }
        let cluster = cluster.map(|mut c| {
            // The peer listener binds where the gRPC listener does.
            c.listen = SocketAddr::new(grpc.ip(), self.cluster.peer_port);
            c.write_behind = write_behind;
            c
        });
        Ok((backend, cluster))
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

/// `host` is an IP literal (IPv6 with or without brackets) or a name resolved now. A name with
/// several addresses binds the first IPv4 one, as Go's `net.Listen("tcp", ...)` does.
pub(super) fn resolve_listener(
    var: &'static str,
    host: &str,
    port: u16,
) -> Result<SocketAddr, SettingsError> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let addrs: Vec<SocketAddr> = (bare, port)
        .to_socket_addrs()
        .map_err(|source| SettingsError::Resolve {
            var,
            host: host.to_owned(),
            source,
        })?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| invalid(var, host, "resolves to no addresses"))
}

/// Two listeners on one address would fail at bind time with a less helpful message. Port 0
/// is exempt: each bind picks its own port.
pub(super) fn check_distinct(
    listeners: &[(&'static str, SocketAddr)],
) -> Result<(), SettingsError> {
    for (i, (var, addr)) in listeners.iter().enumerate() {
        if addr.port() == 0 {
            continue;
        }
        if let Some((other, _)) = listeners[..i].iter().find(|(_, a)| a == addr) {
            return Err(invalid(
                var,
                addr.port(),
                format!("{addr} is already used by the {other} listener"),
            ));
        }
    }
    Ok(())
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

/// Parse `args` (including the program name) and the process environment. A `SLUICE_*`
/// variable that is no setting is an error naming the closest one ([`env_names`]).
///
/// On a bad value for a flag that has an environment variable, the message names both, e.g.
/// `invalid value 'abc' for PORT (--port): invalid digit found in string`, because clap cannot
/// tell which of the two the value came from and operators of the Go service think in variables.
/// `--help` and `--version` also come back as errors; `err.exit()` prints them correctly.
pub fn parse_cli_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut cmd = ignore_empty_env(Cli::command(), &|name| {
        std::env::var_os(name).is_some_and(|v| v.is_empty())
    });
    let settings = setting_variables(&Cli::command());
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    let unknown = env_names::unknown_sluice_variables(
        // Empty counts as unset, for these as for the settings.
        std::env::vars_os()
            .filter(|(_, value)| !value.is_empty())
            .map(|(name, _)| name),
        &settings,
    );
    if !unknown.is_empty() {
        let message = unknown.join("\n");
        return Err(clap::Error::raw(ErrorKind::UnknownArgument, message).format(&mut cmd));
    }
    parse_with(cmd, args)
}

/// Every environment variable a flag of `cmd` or of its subcommands reads.
fn setting_variables(cmd: &clap::Command) -> Vec<String> {
    let own = cmd
        .get_arguments()
        .filter_map(|a| a.get_env())
        .map(|name| name.to_string_lossy().into_owned());
    let nested: Vec<String> = cmd.get_subcommands().flat_map(setting_variables).collect();
    own.chain(nested).collect()
}

/// [`parse_cli_from`] on this process's own arguments.
pub fn parse_cli() -> Result<Cli, clap::Error> {
    parse_cli_from(std::env::args_os())
}

fn parse_with<I, T>(mut cmd: clap::Command, args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let matches = cmd
        .try_get_matches_from_mut(args)
        .map_err(|err| name_env_var(err, &mut cmd))?;
    Cli::from_arg_matches(&matches).map_err(|err| err.format(&mut cmd))
}

/// clap has already read each variable when the command was built; an empty one would then be
/// parsed as an empty value (an error for numbers). Dropping the variable from such arguments
/// makes empty mean unset, at the cost of its `[env: ...]` note in `--help`.
fn ignore_empty_env(cmd: clap::Command, is_empty: &dyn Fn(&str) -> bool) -> clap::Command {
    let subcommands: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .collect();
    let mut cmd = cmd.mut_args(|arg| {
        let empty = arg
            .get_env()
            .and_then(|name| name.to_str())
            .is_some_and(is_empty);
        if empty {
            arg.env(Resettable::Reset)
        } else {
            arg
        }
    });
    for name in subcommands {
        cmd = cmd.mut_subcommand(name, |sub| ignore_empty_env(sub, is_empty));
    }
    cmd
}

/// Rewrite a value error to name the environment variable of the argument, if it has one.
/// The variable is looked up in a freshly built command, so it is found even when
/// [`ignore_empty_env`] removed it from `cmd`.
fn name_env_var(err: clap::Error, cmd: &mut clap::Command) -> clap::Error {
    if err.kind() != ErrorKind::ValueValidation {
        return err;
    }
    let (Some(ContextValue::String(arg)), Some(ContextValue::String(value))) = (
        err.get(ContextKind::InvalidArg),
        err.get(ContextKind::InvalidValue),
    ) else {
        return err;
    };
    // clap renders the argument as `--port <PORT>` or `--shadow-mode[=<BOOL>]`.
    let flag = arg
        .split([' ', '=', '['])
        .next()
        .unwrap_or_default()
        .to_owned();
    let Some(long) = flag.strip_prefix("--") else {
        return err;
    };
    let Some(var) = env_var_of(&Cli::command(), long) else {
        return err;
    };
    let reason = std::error::Error::source(&err)
        .map(|source| source.to_string())
        .unwrap_or_else(|| "invalid value".to_owned());
    let message = format!("invalid value '{value}' for {var} ({flag}): {reason}");
    clap::Error::raw(ErrorKind::ValueValidation, message).format(cmd)
}

fn env_var_of(cmd: &clap::Command, long: &str) -> Option<String> {
    let own = cmd
        .get_arguments()
        .find(|a| a.get_long() == Some(long))
        .and_then(|a| a.get_env())
        .map(|name| name.to_string_lossy().into_owned());
    own.or_else(|| cmd.get_subcommands().find_map(|s| env_var_of(s, long)))
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
mod tests {
    use super::*;
    use crate::service::HeaderNames;

    /// Parse with every environment variable ignored, so tests see only their own arguments
    /// whatever the environment of the test runner holds.
    pub(super) fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        let cmd = ignore_empty_env(Cli::command(), &|_| true);
        parse_with(cmd, std::iter::once("sluice").chain(args.iter().copied()))
    }

    pub(super) fn serve(args: &[&str]) -> ServeArgs {
        let cli = parse(args).expect("arguments parse");
        assert!(cli.command.is_none());
        cli.serve
    }

    pub(super) fn settings(args: &[&str]) -> Result<Settings, SettingsError> {
        serve(args).validate()
    }

    pub(super) fn error(args: &[&str]) -> String {
        settings(args)
            .expect_err("settings are invalid")
            .to_string()
    }

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn negative_hits_are_applied_where_counted_by_default_or_always() {
        let service = |args: &[&str]| settings(args).unwrap().app.service;
        assert_eq!(service(&[]).negative_hits, NegativeHits::Counted);
        assert_eq!(
            service(&["--negative-hits", "always"]).negative_hits,
            NegativeHits::Always
        );
        assert_eq!(
            error(&["--negative-hits", "never"]),
            "SLUICE_NEGATIVE_HITS=never: expected counted or always"
        );
    }

    #[test]
    fn defaults_match_the_go_service() {
        let s = settings(&[]).unwrap();
        assert_eq!(s.addrs.http, "0.0.0.0:8080".parse().unwrap());
        assert_eq!(s.addrs.grpc, "0.0.0.0:8081".parse().unwrap());
        assert_eq!(s.addrs.debug, "0.0.0.0:6070".parse().unwrap());
        assert_eq!(
            s.config.source,
            ConfigSource::Path(PathBuf::from("./config"))
        );
        assert!(!s.config.load.merge_domain_config);
        assert!(!s.config.force_start);
        assert!(!s.app.require_config_for_health);
        assert!(!s.app.service.shadow_mode);
        assert!(!s.app.service.quota_mode);
        assert!(!s.app.service.dynamic_metadata);
        assert_eq!(s.app.telemetry.stats.near_limit_ratio, 0.8);
        assert_eq!(s.app.service.cache_key_prefix, "");
        assert_eq!(s.app.service.response_headers, None);
        assert_eq!(s.log_level, LogLevel::Warn);
        assert_eq!(s.log_format, LogFormat::Text);
        assert_eq!(s.app.backend, Backend::Memory);
        assert_eq!(s.app.max_counters, 1_000_000);
        assert_eq!(s.app.service.max_descriptors, 64);
        assert_eq!(s.app.service.max_entries, 32);
        assert_eq!(s.app.max_request_bytes, 65536);
        assert_eq!(s.config.poll_interval, Duration::from_millis(500));
        assert_eq!(s.app.sweep_interval, Duration::from_secs(10));
        assert_eq!(s.app.drain_timeout, Duration::from_secs(15));

        let raw = serve(&[]);
        assert!(raw.runtime_watch_root);
        assert!(!raw.runtime_ignoredotfiles);
    }

    #[test]
    fn bools_parse_like_go_strconv() {
        for spelling in ["1", "t", "T", "TRUE", "true", "True"] {
            let arg = format!("--shadow-mode={spelling}");
            assert!(
                settings(&[&arg]).unwrap().app.service.shadow_mode,
                "{spelling}"
            );
        }
        for spelling in ["0", "f", "F", "FALSE", "false", "False"] {
            let arg = format!("--runtime-watch-root={spelling}");
            assert!(!serve(&[&arg]).runtime_watch_root, "{spelling}");
        }
        for spelling in ["yes", "on", "tRuE", "", " true"] {
            let arg = format!("--quota-mode={spelling}");
            let err = parse(&[&arg]).expect_err(spelling).to_string();
            assert!(err.contains("QUOTA_MODE (--quota-mode)"), "{err}");
            assert!(
                err.contains("strconv") || err.contains("expected one of"),
                "{err}"
            );
        }
    }

    #[test]
    fn bare_bool_flag_means_true_and_does_not_swallow_the_next_argument() {
        let s = settings(&["--shadow-mode", "--quota-mode", "--port", "9000"]).unwrap();
        assert!(s.app.service.shadow_mode && s.app.service.quota_mode);
        assert_eq!(s.addrs.http.port(), 9000);

        let cli = parse(&["--merge-domain-config", "check-config", "x.yaml"]).unwrap();
        assert!(cli.serve.merge_domain_config);
        assert!(matches!(cli.command, Some(Command::CheckConfig { .. })));
    }

    #[test]
    fn bad_port_names_the_variable() {
        let err = parse(&["--port", "abc"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueValidation);
        let text = err.to_string();
        assert!(
            text.contains("invalid value 'abc' for PORT (--port): invalid digit found in string"),
            "{text}"
        );

        let text = parse(&["--grpc-port=70000"]).unwrap_err().to_string();
        assert!(
            text.contains("invalid value '70000' for GRPC_PORT (--grpc-port)"),
            "{text}"
        );
    }

    #[test]
    fn non_value_errors_are_left_alone() {
        let err = parse(&["--no-such-flag"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::UnknownArgument);
    }

    #[test]
    fn listeners_accept_ips_names_and_port_zero() {
        let s = settings(&[
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--grpc-host",
            "::1",
            "--grpc-port",
            "0",
            "--debug-host",
            "localhost",
            "--debug-port",
            "0",
        ])
        .unwrap();
        assert_eq!(s.addrs.http, "127.0.0.1:0".parse().unwrap());
        assert_eq!(s.addrs.grpc, "[::1]:0".parse().unwrap());
        assert!(s.addrs.debug.ip().is_loopback(), "{}", s.addrs.debug);

        let s = settings(&["--grpc-host", "[::]"]).unwrap();
        assert_eq!(s.addrs.grpc, "[::]:8081".parse().unwrap());
    }

    #[test]
    fn unresolvable_host_names_the_variable() {
        let err = error(&["--grpc-host", "no such host.invalid"]);
        assert!(err.starts_with("GRPC_HOST=no such host.invalid: "), "{err}");
    }

    #[test]
    fn listeners_on_one_address_are_rejected() {
        let err = error(&["--grpc-port", "8080"]);
        assert_eq!(
            err,
            "GRPC_PORT=8080: 0.0.0.0:8080 is already used by the PORT listener"
        );
        // Port 0 never clashes.
        settings(&["--port", "0", "--grpc-port", "0", "--debug-port", "0"]).unwrap();
    }

    #[test]
    fn config_flag_wins_over_runtime_root() {
        let s = settings(&["--config", "/etc/sluice", "--runtime-root", "/srv/rt"]).unwrap();
        assert_eq!(
            s.config.source,
            ConfigSource::Path(PathBuf::from("/etc/sluice"))
        );

        let s = settings(&[
            "--runtime-root",
            "/srv/rt",
            "--runtime-subdirectory",
            "ratelimit",
        ])
        .unwrap();
        assert_eq!(
            s.config.source,
            ConfigSource::Runtime {
                root: PathBuf::from("/srv/rt"),
                subdirectory: "ratelimit".to_owned(),
                app_directory: "config".to_owned(),
            }
        );

        let s = settings(&[
            "--runtime-root",
            "/srv/rt",
            "--runtime-appdirectory",
            "limits",
        ])
        .unwrap();
        assert_eq!(
            s.config.source,
            ConfigSource::Runtime {
                root: PathBuf::from("/srv/rt"),
                subdirectory: String::new(),
                app_directory: "limits".to_owned(),
            }
        );
    }

    #[test]
    fn near_limit_ratio_must_be_in_zero_one() {
        assert_eq!(
            error(&["--near-limit-ratio", "1.5"]),
            "NEAR_LIMIT_RATIO=1.5: must be greater than 0 and at most 1"
        );
        assert!(error(&["--near-limit-ratio", "0"]).starts_with("NEAR_LIMIT_RATIO=0:"));
        assert!(error(&["--near-limit-ratio", "NaN"]).starts_with("NEAR_LIMIT_RATIO=NaN:"));
        assert_eq!(
            settings(&["--near-limit-ratio", "1"])
                .unwrap()
                .app
                .telemetry
                .stats
                .near_limit_ratio,
            1.0
        );
    }

    #[test]
    fn response_headers_are_named_only_when_enabled() {
        let s = settings(&["--limit-response-headers-enabled=true"]).unwrap();
        assert_eq!(
            s.app.service.response_headers,
            Some(HeaderNames {
                limit: "RateLimit-Limit".to_owned(),
                remaining: "RateLimit-Remaining".to_owned(),
                reset: "RateLimit-Reset".to_owned(),
            })
        );
        assert_eq!(
            error(&["--limit-reset-header", "Rate Limit"]),
            "LIMIT_RESET_HEADER=Rate Limit: not a valid HTTP header name"
        );
        assert!(error(&["--limit-limit-header", ""]).starts_with("LIMIT_LIMIT_HEADER=:"));
    }

    #[test]
    fn sluice_limits_are_checked() {
        assert_eq!(
            error(&["--max-counters", "0"]),
            "SLUICE_MAX_COUNTERS=0: must be greater than 0"
        );
        assert!(error(&["--max-request-bytes", "0"]).starts_with("SLUICE_MAX_REQUEST_BYTES=0:"));
        assert!(error(&["--config-poll-ms", "9"]).starts_with("SLUICE_CONFIG_POLL_MS=9:"));
        assert!(error(&["--config-poll-ms", "60001"]).starts_with("SLUICE_CONFIG_POLL_MS=60001:"));
        assert!(
            error(&["--sweep-interval-secs", "0"]).starts_with("SLUICE_SWEEP_INTERVAL_SECS=0:")
        );
        let s = settings(&["--config-poll-ms", "10", "--drain-timeout-secs", "0"]).unwrap();
        assert_eq!(s.config.poll_interval, Duration::from_millis(10));
        assert_eq!(s.app.drain_timeout, Duration::ZERO);
    }

    #[test]
    fn help_shows_each_variable() {
        // Join wrapped lines: a narrow terminal may break `[env:` from the name.
        let help = Cli::command().render_help().to_string();
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        for var in [
            "HOST",
            "PORT",
            "GRPC_HOST",
            "GRPC_PORT",
            "DEBUG_HOST",
            "DEBUG_PORT",
            "SLUICE_CONFIG",
            "RUNTIME_ROOT",
            "RUNTIME_SUBDIRECTORY",
            "RUNTIME_APPDIRECTORY",
            "RUNTIME_WATCH_ROOT",
            "RUNTIME_IGNOREDOTFILES",
            "MERGE_DOMAIN_CONFIG",
            "FORCE_START_WITHOUT_INITIAL_CONFIG",
            "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
            "SHADOW_MODE",
            "QUOTA_MODE",
            "RESPONSE_DYNAMIC_METADATA",
            "NEAR_LIMIT_RATIO",
            "CACHE_KEY_PREFIX",
            "LIMIT_RESPONSE_HEADERS_ENABLED",
            "LIMIT_LIMIT_HEADER",
            "LIMIT_REMAINING_HEADER",
            "LIMIT_RESET_HEADER",
            "LOG_LEVEL",
            "LOG_FORMAT",
            "BACKEND_TYPE",
            "SLUICE_MAX_COUNTERS",
            "SLUICE_MAX_DESCRIPTORS",
            "SLUICE_MAX_ENTRIES",
            "SLUICE_MAX_REQUEST_BYTES",
            "SLUICE_CONFIG_POLL_MS",
            "SLUICE_SWEEP_INTERVAL_SECS",
            "SLUICE_DRAIN_TIMEOUT_SECS",
            "PEERS",
            "SLUICE_PEER_WRITE_BEHIND",
            "SLUICE_PEER_WRITE_BEHIND_MS",
            "CONFIG_TYPE",
            "CONFIG_GRPC_XDS_NODE_ID",
            "CONFIG_GRPC_XDS_SERVER_URL",
            "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
            "GRPC_SERVER_USE_TLS",
            "GRPC_SERVER_TLS_CERT",
            "GRPC_SERVER_TLS_KEY",
            "GRPC_CLIENT_TLS_CACERT",
            "GRPC_CLIENT_TLS_SAN",
            "CONFIG_GRPC_XDS_SERVER_USE_TLS",
            "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
            "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
            "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
            "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
            "USE_PROMETHEUS",
            "PROMETHEUS_ADDR",
            "PROMETHEUS_PATH",
            "DISABLE_STATS",
            "SLUICE_MAX_STAT_KEYS",
            "USE_STATSD",
            "STATSD_HOST",
            "STATSD_PORT",
            "STATS_FLUSH_INTERVAL",
        ] {
            assert!(
                help.contains(&format!("[env: {var}=")),
                "{var} missing:\n{help}"
            );
        }
        assert!(help.contains("[env: REDIS_URL="), "{help}");
        // Secrets are never echoed back from the environment.
        assert!(help.contains("[env: REDIS_AUTH]"), "{help}");
        assert!(help.contains("[env: REDIS_SENTINEL_AUTH]"), "{help}");
        assert!(help.contains("[env: REDIS_TLS_CLIENT_CERT="), "{help}");
        assert!(help.contains("check-config"), "{help}");
    }

    #[test]
    fn help_and_version_come_back_as_clap_errors() {
        let err = parse(&["--help"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::DisplayHelp);
        assert!(err.to_string().contains("--grpc-port"));
        assert_eq!(
            parse(&["--version"]).unwrap_err().kind(),
            ErrorKind::DisplayVersion
        );
    }

    #[test]
    fn check_config_subcommand_parses() {
        let cli = parse(&["check-config", "/etc/ratelimit/config"]).unwrap();
        match cli.command {
            Some(Command::CheckConfig {
                path,
                merge_domain_config,
                strict_envoy,
                rlqs,
            }) => {
                assert_eq!(path, PathBuf::from("/etc/ratelimit/config"));
                assert!(!merge_domain_config);
                assert!(!strict_envoy);
                assert!(!rlqs);
            }
            other => panic!("not check-config: {other:?}"),
        }

        let cli = parse(&["check-config", "--merge-domain-config=T", "x.yaml"]).unwrap();
        assert!(matches!(
            cli.command,
            Some(Command::CheckConfig {
                merge_domain_config: true,
                ..
            })
        ));

        let cli = parse(&["check-config", "--strict-envoy", "x.yaml"]).unwrap();
        assert!(matches!(
            cli.command,
            Some(Command::CheckConfig {
                strict_envoy: true,
                merge_domain_config: false,
                ..
            })
        ));

        assert_eq!(
            parse(&["check-config"]).unwrap_err().kind(),
            ErrorKind::MissingRequiredArgument
        );
        let err = parse(&["check-config", "--merge-domain-config=yes", "x"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("invalid value 'yes' for MERGE_DOMAIN_CONFIG (--merge-domain-config)"),
            "{err}"
        );
    }

    /// Each subsystem owns its configuration type and the settings build it, so the
    /// dependencies point one way: no module but `main` imports the settings (doc comments may
    /// still name them).
    #[test]
    fn no_module_but_main_imports_the_settings() {
        fn rust_files(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    rust_files(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    out.push(path);
                }
            }
        }
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let mut importers = Vec::new();
        for path in files {
            let rel = path.strip_prefix(&src).unwrap();
            if rel.starts_with("settings") || rel == std::path::Path::new("main.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or_default();
                if code.contains("crate::settings") || code.contains("sluice::settings") {
                    importers.push(format!("src/{}:{}", rel.display(), n + 1));
                }
            }
        }
        assert_eq!(importers, Vec::<String>::new());
    }

    #[test]
    fn empty_variables_are_dropped_and_others_kept() {
        let cmd = ignore_empty_env(Cli::command(), &|name| name == "PORT");
        let env_of = |long: &str| {
            cmd.get_arguments()
                .find(|a| a.get_long() == Some(long))
                .and_then(|a| a.get_env())
                .map(|v| v.to_owned())
        };
        assert_eq!(env_of("port"), None);
        assert_eq!(env_of("grpc-port"), Some("GRPC_PORT".into()));
        let sub = cmd.find_subcommand("check-config").unwrap();
        assert!(sub.get_arguments().any(|a| a.get_env().is_some()));

        let cmd = ignore_empty_env(Cli::command(), &|name| name == "MERGE_DOMAIN_CONFIG");
        let sub = cmd.find_subcommand("check-config").unwrap();
        assert!(sub.get_arguments().all(|a| a.get_env().is_none()));
    }
}
