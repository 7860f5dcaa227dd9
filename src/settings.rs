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

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::Resettable;
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{ArgAction, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::app::{AppOptions, Backend};
use crate::cluster::{ClusterConfig, ClusterMode, PeerSource, WriteBehind};
use crate::config::{ConfigSource, FileLimits, LoadOptions};
use crate::service::{HeaderNames, ServiceOptions};
use crate::store::redis::{RedisConfig, RedisTarget, RedisTls, RedisTopology, StartupBackoff};
use crate::telemetry::{LogFormat, LogLevel, TelemetryOptions};
use crate::tls::{GrpcTlsFiles, PeerTlsFiles, XdsTlsFiles};
use crate::xds::{XdsBackoff, XdsConfig};

mod listeners;
pub use listeners::ListenerArgs;
pub mod caps;
mod config_files;
mod peer_tls;
mod redis_breaker;
pub use redis_breaker::RedisBreakerArgs;

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

    /// Add RateLimit-Limit/-Remaining/-Reset headers to responses.
    #[arg(
        long,
        env = "LIMIT_RESPONSE_HEADERS_ENABLED",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Response headers"
    )]
    pub limit_response_headers_enabled: bool,
    /// Name of the header carrying the limit.
    #[arg(
        long,
        env = "LIMIT_LIMIT_HEADER",
        default_value = "RateLimit-Limit",
        help_heading = "Response headers"
    )]
    pub limit_limit_header: String,
    /// Name of the header carrying the remaining hits.
    #[arg(
        long,
        env = "LIMIT_REMAINING_HEADER",
        default_value = "RateLimit-Remaining",
        help_heading = "Response headers"
    )]
    pub limit_remaining_header: String,
    /// Name of the header carrying the seconds until the window resets.
    #[arg(
        long,
        env = "LIMIT_RESET_HEADER",
        default_value = "RateLimit-Reset",
        help_heading = "Response headers"
    )]
    pub limit_reset_header: String,

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

    /// TLS on the gRPC listener, with GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY (both
    /// re-read when the files change, without a restart).
    #[arg(
        long,
        env = "GRPC_SERVER_USE_TLS",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Listeners"
    )]
    pub grpc_server_use_tls: bool,
    /// PEM certificate chain of the gRPC listener (GRPC_SERVER_USE_TLS).
    #[arg(long, env = "GRPC_SERVER_TLS_CERT", help_heading = "Listeners")]
    pub grpc_server_tls_cert: Option<String>,
    /// PEM private key of the gRPC listener (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "GRPC_SERVER_TLS_KEY", help_heading = "Listeners")]
    pub grpc_server_tls_key: Option<String>,
    /// PEM CA certificate(s): when set, gRPC clients must present a certificate signed by one
    /// of them (mTLS).
    #[arg(long, env = "GRPC_CLIENT_TLS_CACERT", help_heading = "Listeners")]
    pub grpc_client_tls_cacert: Option<String>,
    /// With GRPC_CLIENT_TLS_CACERT: the DNS name or IP address the client certificate must
    /// carry as a subject alternative name.
    #[arg(long, env = "GRPC_CLIENT_TLS_SAN", help_heading = "Listeners")]
    pub grpc_client_tls_san: Option<String>,

    /// Counter store: `memory` (counts per node; the default) or `redis` (shared counters,
    /// keyed like envoyproxy/ratelimit). Unset with REDIS_URL set means `redis`.
    #[arg(long, env = "BACKEND_TYPE", help_heading = "Backend")]
    pub backend_type: Option<String>,
    #[command(flatten)]
    pub redis: RedisArgs,
    /// What a request gets when the backend fails: `error` answers gRPC UNKNOWN (HTTP 400 on
    /// /json), as envoyproxy/ratelimit does, and Envoy's failure_mode_deny decides; `allow`
    /// answers OK (fail open).
    #[arg(
        long,
        env = "SLUICE_BACKEND_FAILURE",
        default_value = "error",
        help_heading = "Backend"
    )]
    pub backend_failure: String,
    /// Comma-separated domains that fail open (answer OK) when the backend fails, whatever
    /// SLUICE_BACKEND_FAILURE says.
    #[arg(
        long,
        env = "SLUICE_FAIL_OPEN_DOMAINS",
        default_value = "",
        help_heading = "Backend"
    )]
    pub fail_open_domains: String,

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
    /// limits). `divided`: each node enforces limit / healthy peers locally, with no network
    /// on the request path (Cortex's global limiter).
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
    /// How long concurrent forwards to one peer wait to share one call, in microseconds.
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

/// An unset or empty variable is `None`: the Go service's defaults are "".
fn non_empty(value: Option<&str>) -> Option<&str> {
    value.map(str::trim).filter(|v| !v.is_empty())
}

/// A name a certificate can be verified against: a DNS name or an IP address.
fn tls_name(var: &'static str, value: &str) -> Result<String, SettingsError> {
    rustls::pki_types::ServerName::try_from(value)
        .map(|_| value.to_owned())
        .map_err(|_| invalid(var, value, "expected a DNS name or an IP address"))
}

fn grpc_server_tls(
    cert: Option<&str>,
    key: Option<&str>,
    client_ca: Option<&str>,
    client_san: Option<&str>,
) -> Result<GrpcTlsFiles, SettingsError> {
    let required = |var: &'static str, value: Option<&str>| {
        non_empty(value).map(PathBuf::from).ok_or_else(|| {
            invalid(
                var,
                "",
                "must name a PEM file when GRPC_SERVER_USE_TLS is true",
            )
        })
    };
    let cert = required("GRPC_SERVER_TLS_CERT", cert)?;
    let key = required("GRPC_SERVER_TLS_KEY", key)?;
    let client_ca = non_empty(client_ca).map(PathBuf::from);
    let client_san = match non_empty(client_san) {
        None => None,
        // The Go service accepts a SAN without a CA and then checks nothing, since no client
        // certificate is asked for; a security check that silently does nothing is refused.
        Some(san) if client_ca.is_none() => {
            return Err(invalid(
                "GRPC_CLIENT_TLS_SAN",
                san,
                "needs GRPC_CLIENT_TLS_CACERT: client certificates are only asked for with it",
            ));
        }
        Some(san) => Some(tls_name("GRPC_CLIENT_TLS_SAN", san)?),
    };
    Ok(GrpcTlsFiles {
        cert,
        key,
        client_ca,
        client_san,
    })
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
    #[error(
        "BACKEND_TYPE={value}: the memcache backend is not supported by Sluice; \
         set BACKEND_TYPE=memory to count per node"
    )]
    BackendNotSupported { value: String },
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
        let source = self.config_source();
        let near_limit_ratio = near_limit_ratio(self.near_limit_ratio)?;
        let grpc_tls = self.grpc_tls()?;
        let response_headers = self.response_headers()?;
        let poll_interval = self.poll_interval()?;
        let (backend, cluster) = self.backend_and_cluster(grpc)?;
        let peer_tls = self.peer_tls.validate(cluster.is_some())?;
        let grpc_connection_age = self.compat.validate()?;
        let grpc_uds = self.compat.grpc_uds(self.grpc_server_use_tls)?;
        let log_level = log_level(&self.log_level)?;
        let log_format = log_format(&self.log_format)?;
        let telemetry = self.telemetry.validate(near_limit_ratio)?;
        let prometheus = self.telemetry.prometheus_addr()?;
        let (fail_open, fail_open_domains) = self.fail_open()?;
        let max_counters = non_zero("SLUICE_MAX_COUNTERS", self.max_counters)?.get();
        let caps = self.caps.validate()?;
        let service = ServiceOptions {
            shadow_mode: self.shadow_mode,
            quota_mode: self.quota_mode,
            response_headers,
            cache_key_prefix: self.cache_key_prefix.clone().unwrap_or_default(),
            dynamic_metadata: self.response_dynamic_metadata,
            fail_open,
            fail_open_domains,
            max_descriptors: non_zero("SLUICE_MAX_DESCRIPTORS", self.max_descriptors)?.get(),
            max_entries: non_zero("SLUICE_MAX_ENTRIES", self.max_entries)?.get(),
            max_key_bytes: caps.max_key_bytes.get(),
        };
        let max_request_bytes = non_zero("SLUICE_MAX_REQUEST_BYTES", self.max_request_bytes)?.get();
        let xds = self.xds.validate()?;
        let listener_limits = self.listeners.validate(self.max_request_bytes)?;
        let config = ConfigSettings {
            source,
            load: LoadOptions {
                merge_domain_config: self.merge_domain_config,
            },
            files: self.config_files.validate()?,
            poll_interval,
            force_start: self.force_start_without_initial_config,
            xds,
        };
        let app = AppOptions {
            service,
            max_counters,
            max_counter_bytes: caps.max_counter_bytes.get(),
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
        };
        Ok(Settings {
            app,
            addrs: Addrs {
                http,
                grpc,
                grpc_uds,
                debug,
                prometheus,
            },
            config,
            log_level,
            log_format,
            grpc_tls,
            peer_tls,
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

    fn grpc_tls(&self) -> Result<Option<GrpcTlsFiles>, SettingsError> {
        if !self.grpc_server_use_tls {
            // As in the Go service, the file variables mean nothing without GRPC_SERVER_USE_TLS.
            return Ok(None);
        }
        grpc_server_tls(
            self.grpc_server_tls_cert.as_deref(),
            self.grpc_server_tls_key.as_deref(),
            self.grpc_client_tls_cacert.as_deref(),
            self.grpc_client_tls_san.as_deref(),
        )
        .map(Some)
    }

    /// `None` when LIMIT_RESPONSE_HEADERS_ENABLED is false. The names are checked even then: a
    /// bad name is a typo worth reporting before someone turns the headers on.
    fn response_headers(&self) -> Result<Option<HeaderNames>, SettingsError> {
        let headers = HeaderNames {
            limit: header_name("LIMIT_LIMIT_HEADER", self.limit_limit_header.clone())?,
            remaining: header_name(
                "LIMIT_REMAINING_HEADER",
                self.limit_remaining_header.clone(),
            )?,
            reset: header_name("LIMIT_RESET_HEADER", self.limit_reset_header.clone())?,
        };
        Ok(self.limit_response_headers_enabled.then_some(headers))
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
        let cluster = cluster_settings(
            &self.peers,
            self.peers_dns.as_deref(),
            self.peer_port,
            self.peer_advertise_address.as_deref(),
            &self.cluster_mode,
            self.peer_timeout_ms,
            self.peer_batch_window_us,
        )?;
        let write_behind = write_behind(
            self.peer_write_behind,
            self.peer_write_behind_ms,
            self.backend_type.as_deref(),
            &self.redis,
            cluster.as_ref(),
            self.cache_key_prefix.as_deref().unwrap_or_default(),
        )?;
        let backend = match write_behind {
            // The cluster counts in memory; Redis only keeps the write-behind copy.
            Some(_) => Backend::Memory,
            None => backend(self.backend_type.as_deref(), self.redis.clone())?,
        };
        let (backend, write_behind) = self.redis_breaker.apply(backend, write_behind)?;
        if let (Backend::Redis(_), Some(_)) = (&backend, &cluster) {
            return Err(self.peers_beside_redis());
        }
        let cluster = cluster.map(|mut c| {
            // The peer listener binds where the gRPC listener does.
            c.listen = SocketAddr::new(grpc.ip(), self.peer_port);
            c.write_behind = write_behind;
            c
        });
        Ok((backend, cluster))
    }

    fn peers_beside_redis(&self) -> SettingsError {
        let (var, value) = if self.peers.trim().is_empty() {
            ("PEERS_DNS", self.peers_dns.as_deref().unwrap_or_default())
        } else {
            ("PEERS", self.peers.as_str())
        };
        invalid(
            var,
            value,
            "the Redis backend (BACKEND_TYPE=redis, or REDIS_URL alone) already shares \
             counters between replicas, so peers would be unused; unset the peers, or keep \
             them and set SLUICE_PEER_WRITE_BEHIND=true to write their counters behind to Redis",
        )
    }

    /// SLUICE_BACKEND_FAILURE and SLUICE_FAIL_OPEN_DOMAINS.
    fn fail_open(&self) -> Result<(bool, Vec<String>), SettingsError> {
        let fail_open = match self.backend_failure.to_ascii_lowercase().as_str() {
            "error" => false,
            "allow" => true,
            _ => {
                return Err(invalid(
                    "SLUICE_BACKEND_FAILURE",
                    &self.backend_failure,
                    "expected error or allow",
                ));
            }
        };
        let domains = self
            .fail_open_domains
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(str::to_owned)
            .collect();
        Ok((fail_open, domains))
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
fn resolve_listener(var: &'static str, host: &str, port: u16) -> Result<SocketAddr, SettingsError> {
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
fn check_distinct(listeners: &[(&'static str, SocketAddr)]) -> Result<(), SettingsError> {
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

/// `key=value,key2=value2`, the W3C-baggage-like list OTEL_RESOURCE_ATTRIBUTES and
/// OTEL_EXPORTER_OTLP_HEADERS use: items trimmed, empty items skipped, values percent-decoded.
fn key_values(var: &'static str, list: &str) -> Result<Vec<(String, String)>, SettingsError> {
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| invalid(var, item, "expected key=value"))?;
        let k = k.trim();
        if k.is_empty() {
            return Err(invalid(var, item, "empty key"));
        }
        let v = crate::percent::decode(v.trim().as_bytes()).ok_or_else(|| {
            invalid(
                var,
                item,
                "the value is not valid percent-encoded UTF-8 (a % takes two hex digits)",
            )
        })?;
        out.push((k.to_owned(), v));
    }
    Ok(out)
}

/// An OTLP endpoint as a URL: `http://` (plain text) or `https://` (TLS). Without a scheme,
/// `host:port` is `https://` for gRPC unless `insecure` (OTEL_EXPORTER_OTLP_INSECURE, which the
/// spec defines for exactly this case), and `http://` for OTLP/HTTP (whose endpoints the spec
/// requires to carry a scheme; Sluice has always read `host:port` as http there).
fn otlp_url(
    var: &'static str,
    value: &str,
    protocol: crate::telemetry::otlp::Protocol,
    insecure: bool,
) -> Result<String, SettingsError> {
    use crate::telemetry::otlp::Protocol;
    let value = value.trim();
    let url = if value.contains("://") {
        value.to_owned()
    } else if protocol == Protocol::Grpc && !insecure {
        format!("https://{value}")
    } else {
        format!("http://{value}")
    };
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| invalid(var, value, format!("not a URL: {e}")))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(invalid(var, value, "expected an http:// or https:// URL")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(invalid(var, value, "no host"));
    }
    Ok(url)
}

/// The first of a signal's own variable and the common one that is set and not empty.
fn first_set<'a>(
    vars: [(&'static str, &'a Option<String>); 2],
) -> Option<(usize, &'static str, &'a str)> {
    vars.iter()
        .enumerate()
        .find_map(|(i, &(var, v))| non_empty(v.as_deref()).map(|v| (i, var, v)))
}

/// One signal's OTLP TLS files, each variable given as `[own, common]` (the signal's own
/// wins). A client certificate needs its key and the other way round; the variable named as
/// missing is the one beside the one that is set.
fn otlp_tls_files(
    ca: [(&'static str, &Option<String>); 2],
    cert: [(&'static str, &Option<String>); 2],
    key: [(&'static str, &Option<String>); 2],
) -> Result<
    (
        Option<crate::tls::PemFile>,
        Option<crate::tls::KeyPairFiles>,
    ),
    SettingsError,
> {
    use crate::tls::{KeyPairFiles, PemFile};
    let ca = first_set(ca).map(|(_, var, path)| PemFile::new(var, path));
    let identity = match (first_set(cert), first_set(key)) {
        (None, None) => None,
        (Some((_, cert_var, c)), Some((_, key_var, k))) => Some((cert_var, c, key_var, k)),
        (Some((i, cert_var, c)), None) => Some((cert_var, c, key[i].0, "")),
        (None, Some((i, key_var, k))) => Some((cert[i].0, "", key_var, k)),
    };
    let identity = match identity {
        None => None,
        Some((cert_var, c, key_var, k)) => {
            key_pair((cert_var, c), (key_var, k))?.map(|(cert, key)| KeyPairFiles {
                cert: PemFile::new(cert_var, cert),
                key: PemFile::new(key_var, key),
            })
        }
    };
    Ok((ca, identity))
}

/// Accepts what logrus's `ParseLevel` accepts, so existing LOG_LEVEL values keep working.
fn log_level(value: &str) -> Result<LogLevel, SettingsError> {
    match value.to_ascii_lowercase().as_str() {
        "trace" => Ok(LogLevel::Trace),
        "debug" => Ok(LogLevel::Debug),
        "info" => Ok(LogLevel::Info),
        "warn" | "warning" => Ok(LogLevel::Warn),
        "error" | "fatal" | "panic" => Ok(LogLevel::Error),
        _ => Err(invalid(
            "LOG_LEVEL",
            value,
            "expected trace, debug, info, warn, warning, error, fatal or panic",
        )),
    }
}

/// Go treats anything but `json` as text; Sluice refuses other values so a typo is not silent.
fn log_format(value: &str) -> Result<LogFormat, SettingsError> {
    match value.to_ascii_lowercase().as_str() {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        _ => Err(invalid("LOG_FORMAT", value, "expected text or json")),
    }
}

/// A memory backend counts per node. Where the operator configured Redis (REDIS_URL without
/// BACKEND_TYPE, as envoyproxy/ratelimit deployments do) Sluice uses Redis: falling back to
/// memory would multiply every limit by the replica count without a word.
fn backend(backend_type: Option<&str>, redis: RedisArgs) -> Result<Backend, SettingsError> {
    let kind = match backend_type {
        Some(v) => v.to_ascii_lowercase(),
        None if redis.redis_url.is_some() => "redis".to_owned(),
        None => "memory".to_owned(),
    };
    match kind.as_str() {
        "memory" => Ok(Backend::Memory),
        "redis" => redis.validate().map(|r| Backend::Redis(Box::new(r))),
        "memcache" => Err(SettingsError::BackendNotSupported {
            value: kind.clone(),
        }),
        _ => Err(invalid(
            "BACKEND_TYPE",
            kind,
            "unknown backend; expected memory or redis",
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
    pub redis_auth: String,
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
    pub redis_sentinel_auth: String,
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
    pub redis_persecond_auth: String,
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
    pub redis_persecond_sentinel_auth: String,
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
}

/// envoyproxy/ratelimit variables Sluice either implements outside the groups above or
/// refuses at start-up when set to something it cannot honour, so none is silently ignored.
#[derive(Clone, Debug, clap::Args)]
pub struct CompatArgs {
    /// Serve gRPC on this unix socket path instead of GRPC_HOST:GRPC_PORT, as in Go. A stale
    /// socket file is replaced; a socket something still listens on, or another file, is not.
    #[arg(long, env = "GRPC_UDS", help_heading = "Listeners")]
    pub grpc_uds: Option<String>,
    /// A gRPC connection older than this gets a GOAWAY (Go duration; 0 never).
    #[arg(
        long,
        env = "GRPC_MAX_CONNECTION_AGE",
        default_value = "24h",
        help_heading = "Listeners"
    )]
    pub grpc_max_connection_age: String,
    /// After GRPC_MAX_CONNECTION_AGE's GOAWAY, how long calls in flight may take before the
    /// connection is closed (Go duration; 0 as long as they take).
    #[arg(
        long,
        env = "GRPC_MAX_CONNECTION_AGE_GRACE",
        default_value = "1h",
        help_heading = "Listeners"
    )]
    pub grpc_max_connection_age_grace: String,
    /// Response-time histogram in milliseconds. Not supported: Sluice's is in seconds; true stops start-up.
    #[arg(
        long,
        env = "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Stats"
    )]
    pub prometheus_response_time_as_milliseconds: bool,
    /// A statsd-exporter mapping file. Not supported: Sluice's names are the default mapping's; a value stops start-up.
    #[arg(long, env = "PROMETHEUS_MAPPER_YAML", help_heading = "Stats")]
    pub prometheus_mapper_yaml: Option<String>,
    /// Constant tags on every stat (`k1:v1,k2:v2`). Not supported yet: a value stops start-up.
    #[arg(long, env = "EXTRA_TAGS", help_heading = "Stats")]
    pub extra_tags: Option<String>,
    /// DogStatsD tags. Not supported: true stops start-up.
    #[arg(
        long,
        env = "USE_DOG_STATSD",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Stats"
    )]
    pub use_dog_statsd: bool,
    /// DogStatsD mogrifiers; meaningful only with USE_DOG_STATSD, which is refused.
    #[arg(long, env = "USE_DOG_STATSD_MOGRIFIERS", help_heading = "Stats")]
    pub use_dog_statsd_mogrifiers: Option<String>,
    /// Ignored: only read with BACKEND_TYPE=memcache, which Sluice refuses.
    #[arg(
        long,
        env = "MEMCACHE_HOST_PORT",
        help_heading = "Memcache (not supported; ignored)"
    )]
    pub memcache_host_port: Option<String>,
    /// Ignored (see MEMCACHE_HOST_PORT).
    #[arg(
        long,
        env = "MEMCACHE_MAX_IDLE_CONNS",
        help_heading = "Memcache (not supported; ignored)"
    )]
    pub memcache_max_idle_conns: Option<String>,
    /// Ignored (see MEMCACHE_HOST_PORT).
    #[arg(
        long,
        env = "MEMCACHE_SRV",
        help_heading = "Memcache (not supported; ignored)"
    )]
    pub memcache_srv: Option<String>,
    /// Ignored (see MEMCACHE_HOST_PORT).
    #[arg(
        long,
        env = "MEMCACHE_SRV_REFRESH",
        help_heading = "Memcache (not supported; ignored)"
    )]
    pub memcache_srv_refresh: Option<String>,
    /// Ignored (see MEMCACHE_HOST_PORT).
    #[arg(
        long,
        env = "MEMCACHE_TLS",
        help_heading = "Memcache (not supported; ignored)"
    )]
    pub memcache_tls: Option<String>,
    /// Ignored (see MEMCACHE_HOST_PORT).
    #[arg(
        long,
        env = "MEMCACHE_TLS_CLIENT_CERT",
        help_heading = "Memcache (not supported; ignored)"
    )]
    pub memcache_tls_client_cert: Option<String>,
    /// Ignored (see MEMCACHE_HOST_PORT).
    #[arg(
        long,
        env = "MEMCACHE_TLS_CLIENT_KEY",
        help_heading = "Memcache (not supported; ignored)"
    )]
    pub memcache_tls_client_key: Option<String>,
    /// Ignored (see MEMCACHE_HOST_PORT).
    #[arg(
        long,
        env = "MEMCACHE_TLS_CACERT",
        help_heading = "Memcache (not supported; ignored)"
    )]
    pub memcache_tls_cacert: Option<String>,
    /// Ignored (see MEMCACHE_HOST_PORT).
    #[arg(
        long,
        env = "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
        help_heading = "Memcache (not supported; ignored)"
    )]
    pub memcache_tls_skip_hostname_verification: Option<String>,
}

impl CompatArgs {
    /// GRPC_UDS: where gRPC is served instead of GRPC_HOST:GRPC_PORT, as in Go.
    fn grpc_uds(&self, grpc_tls: bool) -> Result<Option<PathBuf>, SettingsError> {
        let Some(path) = non_empty(self.grpc_uds.as_deref()) else {
            return Ok(None);
        };
        if grpc_tls {
            return Err(SettingsError::NotSupportedYet {
                var: "GRPC_UDS",
                value: path.to_owned(),
                reason: "TLS (GRPC_SERVER_USE_TLS) on the unix socket",
            });
        }
        Ok(Some(PathBuf::from(path)))
    }

    fn validate(&self) -> Result<Option<crate::net::ConnectionAge>, SettingsError> {
        let not_yet = |var: &'static str, value: &str, reason: &'static str| {
            Err(SettingsError::NotSupportedYet {
                var,
                value: value.to_owned(),
                reason,
            })
        };
        if let Some(tags) = non_empty(self.extra_tags.as_deref()) {
            return not_yet("EXTRA_TAGS", tags, "constant tags on every stat");
        }
        if self.prometheus_response_time_as_milliseconds {
            return Err(invalid(
                "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
                true,
                "not supported: Sluice's ratelimit_service_response_time_seconds histogram is \
                 in seconds, as Prometheus names it; unset it",
            ));
        }
        if let Some(path) = non_empty(self.prometheus_mapper_yaml.as_deref()) {
            return Err(invalid(
                "PROMETHEUS_MAPPER_YAML",
                path,
                "not supported: Sluice exports the names envoyproxy/ratelimit's default \
                 mapping produces; unset it",
            ));
        }
        if self.use_dog_statsd {
            return Err(invalid(
                "USE_DOG_STATSD",
                true,
                "not supported: Sluice sends plain statsd (USE_STATSD); unset it",
            ));
        }
        let duration = |var: &'static str, value: &str| {
            parse_go_duration(value)
                .ok_or_else(|| invalid(var, value, "expected a Go duration such as 1h or 30m"))
        };
        let max_age = duration("GRPC_MAX_CONNECTION_AGE", &self.grpc_max_connection_age)?;
        let grace = duration(
            "GRPC_MAX_CONNECTION_AGE_GRACE",
            &self.grpc_max_connection_age_grace,
        )?;
        // grpc-go reads 0 as infinity, for both.
        Ok((!max_age.is_zero()).then_some(crate::net::ConnectionAge {
            max_age,
            grace: (!grace.is_zero()).then_some(grace),
        }))
    }
}

/// envoyproxy/ratelimit's config-source settings: files (the default) or an xDS server.
#[derive(Clone, Debug, clap::Args)]
pub struct XdsArgs {
    /// `FILE` (the YAML files; the default) or `GRPC_XDS_SOTW` (RateLimitConfig resources
    /// streamed by an xDS server, as Envoy Gateway does).
    #[arg(
        long,
        env = "CONFIG_TYPE",
        default_value = "FILE",
        help_heading = "xDS config"
    )]
    pub config_type: String,
    /// The node id sent to the xDS server, which picks the snapshot by it.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_NODE_ID",
        default_value = "default",
        help_heading = "xDS config"
    )]
    pub config_grpc_xds_node_id: String,
    /// Node metadata sent to the xDS server: comma-separated `key=value` pairs.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_NODE_METADATA",
        default_value = "",
        help_heading = "xDS config"
    )]
    pub config_grpc_xds_node_metadata: String,
    /// The xDS server, `host:port`.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_SERVER_URL",
        default_value = "localhost:18000",
        help_heading = "xDS config"
    )]
    pub config_grpc_xds_server_url: String,
    /// After an established stream ends, wait about this long (Go duration) before reconnecting.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        default_value = "3s",
        help_heading = "xDS config"
    )]
    pub config_grpc_xds_server_connect_retry_interval: String,
    /// gRPC metadata added to the xDS stream: comma-separated `key:value` (envconfig's map
    /// format, as in the Go service) or `key=value` pairs.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        default_value = "",
        hide_env_values = true,
        help_heading = "xDS config"
    )]
    pub config_grpc_xds_client_additional_headers: String,
    /// TLS to the xDS server (an `https://` CONFIG_GRPC_XDS_SERVER_URL implies it).
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_SERVER_USE_TLS",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "xDS config"
    )]
    pub config_grpc_xds_server_use_tls: bool,
    /// PEM certificate Sluice presents to the xDS server (with CONFIG_GRPC_XDS_CLIENT_TLS_KEY).
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        help_heading = "xDS config"
    )]
    pub config_grpc_xds_client_tls_cert: Option<String>,
    /// PEM private key of CONFIG_GRPC_XDS_CLIENT_TLS_CERT.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
        help_heading = "xDS config"
    )]
    pub config_grpc_xds_client_tls_key: Option<String>,
    /// PEM CA certificate(s) the xDS server's certificate must chain to; unset, the system's
    /// trust store.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
        help_heading = "xDS config"
    )]
    pub config_grpc_xds_server_tls_cacert: Option<String>,
    /// Name (DNS or IP) to verify the xDS server's certificate against; unset, the URL's host.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
        help_heading = "xDS config"
    )]
    pub config_grpc_xds_server_tls_san: Option<String>,
    /// First delay (Go duration) after a failed connection attempt; doubles per failure.
    #[arg(
        long,
        env = "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
        default_value = "10s",
        help_heading = "xDS config"
    )]
    pub xds_client_backoff_initial_interval: String,
    /// Longest delay (Go duration) between connection attempts.
    #[arg(
        long,
        env = "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
        default_value = "60s",
        help_heading = "xDS config"
    )]
    pub xds_client_backoff_max_interval: String,
    /// With XDS_CLIENT_BACKOFF_JITTER, each delay is randomised within ±this fraction; in [0, 1].
    #[arg(
        long,
        env = "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
        default_value_t = 0.5,
        help_heading = "xDS config"
    )]
    pub xds_client_backoff_random_factor: f64,
    /// Randomise reconnection delays, so replicas do not reconnect in lockstep.
    #[arg(
        long,
        env = "XDS_CLIENT_BACKOFF_JITTER",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "true",
        value_parser = parse_go_bool,
        help_heading = "xDS config"
    )]
    pub xds_client_backoff_jitter: bool,
    /// Largest xDS response accepted, in bytes; 0 or unset keeps gRPC's 4 MiB.
    #[arg(
        long,
        env = "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
        help_heading = "xDS config"
    )]
    pub xds_client_max_msg_size_in_bytes: Option<usize>,
}

impl XdsArgs {
    /// `None` for CONFIG_TYPE=FILE. The xDS variables are only checked for GRPC_XDS_SOTW, so
    /// leftovers in a file-based deployment cannot stop it.
    fn validate(self) -> Result<Option<XdsConfig>, SettingsError> {
        match self.config_type.to_ascii_uppercase().as_str() {
            "FILE" => return Ok(None),
            "GRPC_XDS_SOTW" => {}
            _ => {
                return Err(invalid(
                    "CONFIG_TYPE",
                    &self.config_type,
                    "expected FILE or GRPC_XDS_SOTW",
                ));
            }
        }
        if self.config_grpc_xds_node_id.is_empty() {
            return Err(invalid("CONFIG_GRPC_XDS_NODE_ID", "", "must not be empty"));
        }
        let node_metadata = pairs(&self.config_grpc_xds_node_metadata, &['='])
            .map_err(|e| invalid("CONFIG_GRPC_XDS_NODE_METADATA", e, "expected key=value"))?;
        let additional_headers =
            pairs(&self.config_grpc_xds_client_additional_headers, &[':', '='])
                .map_err(|e| {
                    invalid(
                        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                        e,
                        "expected key:value or key=value",
                    )
                })?
                .into_iter()
                .map(|(k, v)| grpc_metadata(k, v))
                .collect::<Result<Vec<_>, _>>()?;
        let (target, https) = xds_server_target(&self.config_grpc_xds_server_url)?;
        let tls = if self.config_grpc_xds_server_use_tls || https {
            Some(xds_tls(
                self.config_grpc_xds_client_tls_cert.as_deref(),
                self.config_grpc_xds_client_tls_key.as_deref(),
                self.config_grpc_xds_server_tls_cacert.as_deref(),
                self.config_grpc_xds_server_tls_san.as_deref(),
            )?)
        } else {
            None
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        let server_uri = format!("{scheme}://{target}");
        let duration = |var: &'static str, value: &str| {
            parse_go_duration(value)
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    invalid(
                        var,
                        value,
                        "expected a positive Go duration such as 500ms or 3s",
                    )
                })
        };
        let connect_retry_interval = duration(
            "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
            &self.config_grpc_xds_server_connect_retry_interval,
        )?;
        let initial = duration(
            "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
            &self.xds_client_backoff_initial_interval,
        )?;
        let max = duration(
            "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
            &self.xds_client_backoff_max_interval,
        )?;
        if max < initial {
            return Err(invalid(
                "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
                &self.xds_client_backoff_max_interval,
                "must not be shorter than XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
            ));
        }
        let random_factor = self.xds_client_backoff_random_factor;
        if !(0.0..=1.0).contains(&random_factor) {
            return Err(invalid(
                "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
                random_factor,
                "must be between 0 and 1",
            ));
        }
        Ok(Some(XdsConfig {
            node_id: self.config_grpc_xds_node_id,
            node_metadata,
            server_uri,
            connect_retry_interval,
            additional_headers,
            backoff: XdsBackoff {
                initial,
                max,
                random_factor,
                jitter: self.xds_client_backoff_jitter,
            },
            max_msg_size: self.xds_client_max_msg_size_in_bytes.filter(|&n| n > 0),
            tls,
        }))
    }
}

/// Comma-separated pairs split at the first of `separators`; empty items are skipped. The
/// error is the offending item. (Go skips an item without a separator; a typo is an error here.)
fn pairs(value: &str, separators: &[char]) -> Result<Vec<(String, String)>, String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| match item.split_once(separators) {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.to_owned())),
            _ => Err(item.to_owned()),
        })
        .collect()
}

/// gRPC metadata keys are lower case (Go's `metadata.New` lower-cases them too); binary
/// (`-bin`) keys and non-ASCII values cannot come from an environment variable sensibly.
fn grpc_metadata(key: String, value: String) -> Result<(String, String), SettingsError> {
    let var = "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS";
    let key = key.to_ascii_lowercase();
    let key_ok = key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if !key_ok || key.ends_with("-bin") || key.starts_with("grpc-") {
        return Err(invalid(var, key, "not a valid ASCII gRPC metadata key"));
    }
    if !value.bytes().all(|b| b == b' ' || b.is_ascii_graphic()) {
        return Err(invalid(var, key, "the value must be printable ASCII"));
    }
    Ok((key, value))
}

/// A client certificate and its key: both files, or neither. The Go service silently connects
/// without a client certificate when only one of the two is set; that is almost certainly a typo,
/// so it stops start-up here.
fn key_pair(
    (cert_var, cert): (&'static str, &str),
    (key_var, key): (&'static str, &str),
) -> Result<Option<(PathBuf, PathBuf)>, SettingsError> {
    match (non_empty(Some(cert)), non_empty(Some(key))) {
        (Some(c), Some(k)) => Ok(Some((PathBuf::from(c), PathBuf::from(k)))),
        (None, None) => Ok(None),
        (Some(c), None) => Err(invalid(
            cert_var,
            c,
            format!("needs {key_var}, the certificate's private key"),
        )),
        (None, Some(k)) => Err(invalid(
            key_var,
            k,
            format!("needs {cert_var}, the certificate of this key"),
        )),
    }
}

fn xds_tls(
    cert: Option<&str>,
    key: Option<&str>,
    ca: Option<&str>,
    san: Option<&str>,
) -> Result<XdsTlsFiles, SettingsError> {
    let client_identity = key_pair(
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert.unwrap_or("")),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", key.unwrap_or("")),
    )?;
    Ok(XdsTlsFiles {
        client_identity,
        server_ca: non_empty(ca).map(PathBuf::from),
        server_name: non_empty(san)
            .map(|s| tls_name("CONFIG_GRPC_XDS_SERVER_TLS_SAN", s))
            .transpose()?,
    })
}

/// The Go service dials a gRPC target, `host:port`; `http://host:port`, `https://host:port`
/// and `dns:///host:port` are accepted too. Returns `host:port` and whether the URL asked for
/// TLS (`https://`).
fn xds_server_target(url: &str) -> Result<(String, bool), SettingsError> {
    let var = "CONFIG_GRPC_XDS_SERVER_URL";
    let (rest, https) = match url.strip_prefix("https://") {
        Some(rest) => (rest, true),
        None => (url, false),
    };
    let target = rest
        .strip_prefix("http://")
        .or_else(|| rest.strip_prefix("dns:///"))
        .unwrap_or(rest)
        .trim_end_matches('/');
    let valid = target.rsplit_once(':').is_some_and(|(host, port)| {
        let host_ok = !host.is_empty()
            && !host.contains(['/', '@', '?', '#', ' '])
            && (host.starts_with('[') == host.ends_with(']'));
        host_ok && port.parse::<u16>().is_ok_and(|p| p > 0)
    });
    if !valid {
        return Err(invalid(var, url, "expected host:port"));
    }
    Ok((target.to_owned(), https))
}

/// REDIS_POOL_ON_EMPTY_BEHAVIOR: only `WAIT` (any case) describes what Sluice does.
fn pool_on_empty(var: &'static str, value: &str) -> Result<(), SettingsError> {
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
    fn validate(self) -> Result<RedisConfig, SettingsError> {
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
        let per_second = if self.redis_persecond {
            Some(redis_target(
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
            )?)
        } else {
            None
        };
        let timeout = parse_go_duration(&self.redis_timeout)
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                invalid(
                    "REDIS_TIMEOUT",
                    &self.redis_timeout,
                    "expected a positive Go duration such as 250ms or 1s",
                )
            })?;
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
        )?;
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
        Ok(RedisConfig {
            main,
            per_second,
            timeout,
            expiration_jitter_max_seconds: self.expiration_jitter_max_seconds,
            local_cache_size_in_bytes: self.local_cache_size_in_bytes,
            stop_cache_key_increment_when_overlimit: self.stop_cache_key_increment_when_overlimit,
            startup: StartupBackoff {
                initial,
                max,
                max_elapsed: (!max_elapsed.is_zero()).then_some(max_elapsed),
            },
            // Set from RedisBreakerArgs by ServeArgs::validate.
            breaker: Default::default(),
        })
    }

    /// Reads the REDIS_TLS_* files and checks them as the other TLS clients' are, so a missing,
    /// unreadable or mismatched file stops start-up with a message naming it (Go panics).
    fn tls(&self) -> Result<RedisTls, SettingsError> {
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

#[allow(clippy::too_many_arguments)]
fn cluster_settings(
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
fn write_behind(
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

/// Builds redis-rs URLs from the Go service's (socket type, address, auth) settings.
///
/// As in Go, a cluster's seeds and the sentinels are TCP addresses whatever REDIS_SOCKET_TYPE
/// says, and REDIS_AUTH is the master's password while REDIS_SENTINEL_AUTH is the sentinels'.
fn redis_target(
    (url_var, url): (&'static str, Option<&str>),
    (socket_var, socket_type): (&'static str, &str),
    (type_var, redis_type): (&'static str, &str),
    (auth, sentinel_auth): (&str, &str),
    (tls_var, tls): (&'static str, Option<RedisTls>),
) -> Result<RedisTarget, SettingsError> {
    let Some(url) = url.filter(|u| !u.trim().is_empty()) else {
        return Err(invalid(url_var, "", "required for the Redis backend"));
    };
    let mut addresses: Vec<&str> = url
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    let topology = match redis_type.to_ascii_lowercase().as_str() {
        "single" => RedisTopology::Single,
        "cluster" => RedisTopology::Cluster,
        "sentinel" => {
            let expected =
                "expected <master name>,<sentinel host:port>,... for REDIS_TYPE=sentinel";
            if addresses.len() < 2 {
                return Err(invalid(url_var, url, expected));
            }
            let name = addresses.remove(0);
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
            RedisTopology::Sentinel {
                master_name: name.to_owned(),
                master_userinfo: userinfo(auth),
            }
        }
        _ => {
            return Err(invalid(
                type_var,
                redis_type,
                "expected single, sentinel or cluster",
            ));
        }
    };
    let unix = match socket_type.to_ascii_lowercase().as_str() {
        "tcp" => false,
        "unix" => topology == RedisTopology::Single,
        _ => return Err(invalid(socket_var, socket_type, "expected tcp or unix")),
    };
    // The credentials in the URLs: the sentinels' for sentinels, else REDIS_AUTH.
    let auth = match topology {
        RedisTopology::Sentinel { .. } => sentinel_auth,
        _ => auth,
    };
    let scheme = if tls.is_some() { "rediss" } else { "redis" };
    let urls = addresses
        .iter()
        .map(|&u| {
            if let Some(rest) = u.strip_prefix("redis://") {
                Ok(format!("{scheme}://{rest}"))
            } else if u.starts_with("rediss://") {
                match tls {
                    Some(_) => Ok(u.to_owned()),
                    None => Err(invalid(
                        url_var,
                        u,
                        format!("a rediss:// URL needs {tls_var}=true (and its REDIS_TLS_* files)"),
                    )),
                }
            } else if u.starts_with("redis+unix://") || u.starts_with("unix://") || unix {
                if tls.is_some() {
                    return Err(invalid(
                        url_var,
                        u,
                        format!("{tls_var}=true needs a TCP address ({socket_var}=tcp): Redis serves TLS on TCP only"),
                    ));
                }
                if u.contains("://") {
                    return Ok(u.to_owned());
                }
                // redis-rs takes the password of a socket as a query parameter.
                let pass = match auth.split_once(':') {
                    _ if auth.is_empty() => String::new(),
                    Some((user, pass)) => format!(
                        "?user={}&pass={}",
                        percent_encode(user),
                        percent_encode(pass)
                    ),
                    None => format!("?pass={}", percent_encode(auth)),
                };
                Ok(format!("redis+unix://{u}{pass}"))
            } else if u.contains(':') {
                Ok(format!("{scheme}://{}{u}", userinfo(auth)))
            } else {
                Err(invalid(url_var, u, "expected host:port"))
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    if urls.len() > 1 && topology == RedisTopology::Single {
        return Err(invalid(
            url_var,
            url,
            "several addresses need REDIS_TYPE=cluster (or sentinel)",
        ));
    }
    Ok(RedisTarget {
        urls,
        topology,
        tls,
    })
}

/// `user:password` or `password`, percent-encoded into a URL's userinfo.
fn userinfo(auth: &str) -> String {
    match auth.split_once(':') {
        _ if auth.is_empty() => String::new(),
        Some((user, pass)) => format!("{}:{}@", percent_encode(user), percent_encode(pass)),
        None => format!(":{}@", percent_encode(auth)),
    }
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Parses a Go `time.Duration` string: a sequence of decimal numbers with units ns, us (µs),
/// ms, s, m, h, such as `300ms`, `1.5s` or `1m30s`; a bare `0` is zero.
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = s;
    let mut total = 0f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_len);
        let value: f64 = num.parse().ok()?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += value * scale;
        rest = tail;
    }
    Duration::try_from_secs_f64(total).ok()
}

fn non_zero(var: &'static str, value: usize) -> Result<NonZeroUsize, SettingsError> {
    NonZeroUsize::new(value).ok_or_else(|| invalid(var, value, "must be greater than 0"))
}

/// A boolean value that Go's `strconv.ParseBool` would reject.
#[derive(Debug, thiserror::Error)]
#[error("expected one of 1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False")]
pub struct InvalidBool;

/// Parse a boolean exactly as Go's `strconv.ParseBool`, so values that worked for the Go
/// service mean the same here and values it rejected are rejected.
pub fn parse_go_bool(value: &str) -> Result<bool, InvalidBool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(InvalidBool),
    }
}

/// Parse `args` (including the program name) and the process environment.
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
    let cmd = ignore_empty_env(Cli::command(), &|name| {
        std::env::var_os(name).is_some_and(|v| v.is_empty())
    });
    parse_with(cmd, args)
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

/// Metrics settings: envoyproxy/ratelimit's stats variables and Sluice's cap on stats keys.
#[derive(Clone, Debug, clap::Args)]
pub struct TelemetryArgs {
    /// Serve the Prometheus exposition on its own listener (PROMETHEUS_ADDR) as well as at
    /// /metrics on the debug port.
    #[arg(
        long,
        env = "USE_PROMETHEUS",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Metrics"
    )]
    pub use_prometheus: bool,
    /// Address of the USE_PROMETHEUS listener, `host:port` or `:port`.
    #[arg(
        long,
        env = "PROMETHEUS_ADDR",
        default_value = ":9090",
        help_heading = "Metrics"
    )]
    pub prometheus_addr: String,
    /// Path of the exposition on the USE_PROMETHEUS listener.
    #[arg(
        long,
        env = "PROMETHEUS_PATH",
        default_value = "/metrics",
        help_heading = "Metrics"
    )]
    pub prometheus_path: String,
    /// Record no stats at all.
    #[arg(
        long,
        env = "DISABLE_STATS",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Metrics"
    )]
    pub disable_stats: bool,
    /// Most distinct per-limit stats keys (and unknown domains) kept; records for new keys
    /// past it add up in one `_overflow_` series.
    #[arg(
        long,
        env = "SLUICE_MAX_STAT_KEYS",
        default_value_t = 10_000,
        help_heading = "Metrics"
    )]
    pub max_stat_keys: usize,
    /// Push counters to statsd over UDP (off by default in Sluice; on in the Go service).
    #[arg(
        long,
        env = "USE_STATSD",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Metrics"
    )]
    pub use_statsd: bool,
    /// The statsd server's host.
    #[arg(
        long,
        env = "STATSD_HOST",
        default_value = "localhost",
        help_heading = "Metrics"
    )]
    pub statsd_host: String,
    /// The statsd server's UDP port.
    #[arg(
        long,
        env = "STATSD_PORT",
        default_value_t = 8125,
        help_heading = "Metrics"
    )]
    pub statsd_port: u16,
    /// How often counters are pushed to statsd (Go duration).
    #[arg(
        long,
        env = "STATS_FLUSH_INTERVAL",
        default_value = "10s",
        help_heading = "Metrics"
    )]
    pub stats_flush_interval: String,

    /// Export spans of ShouldRateLimit and its backend calls over OTLP. Unset: on when
    /// OTEL_TRACES_EXPORTER=otlp. OTEL_SDK_DISABLED=true turns it off either way.
    #[arg(
        long,
        env = "TRACING_ENABLED",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = parse_go_bool,
        help_heading = "Tracing"
    )]
    pub tracing_enabled: Option<bool>,
    /// service.name. Default: OTEL_SERVICE_NAME, else `service.name` in
    /// OTEL_RESOURCE_ATTRIBUTES, else RateLimit.
    #[arg(long, env = "TRACING_SERVICE_NAME", help_heading = "Tracing")]
    pub tracing_service_name: Option<String>,
    /// service.namespace. Default: `service.namespace` in OTEL_RESOURCE_ATTRIBUTES.
    #[arg(long, env = "TRACING_SERVICE_NAMESPACE", help_heading = "Tracing")]
    pub tracing_service_namespace: Option<String>,
    /// service.instance.id. Default: `service.instance.id` in OTEL_RESOURCE_ATTRIBUTES, else
    /// a random UUID.
    #[arg(long, env = "TRACING_SERVICE_INSTANCE_ID", help_heading = "Tracing")]
    pub tracing_service_instance_id: Option<String>,
    /// `http` (OTLP/HTTP, protobuf) or `grpc`. Default: OTEL_EXPORTER_OTLP_PROTOCOL, else http.
    #[arg(long, env = "TRACING_EXPORTER_PROTOCOL", help_heading = "Tracing")]
    pub tracing_exporter_protocol: Option<String>,
    /// Share of root spans (calls without a caller trace context) sampled, 0 to 1; a caller's
    /// sampled flag is followed. Default: OTEL_TRACES_SAMPLER(_ARG), else 1.
    #[arg(long, env = "TRACING_SAMPLING_RATE", help_heading = "Tracing")]
    pub tracing_sampling_rate: Option<f64>,
    /// `otlp` turns tracing on when TRACING_ENABLED is unset; `none` leaves it off.
    #[arg(long, env = "OTEL_TRACES_EXPORTER", help_heading = "Tracing")]
    pub otel_traces_exporter: Option<String>,
    /// `true` turns tracing and OTLP metrics off whatever else says.
    #[arg(
        long,
        env = "OTEL_SDK_DISABLED",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = parse_go_bool,
        default_value = "false",
        help_heading = "Tracing"
    )]
    pub otel_sdk_disabled: bool,
    /// always_on, always_off, traceidratio and their parentbased_ forms (all parent-based here);
    /// read when TRACING_SAMPLING_RATE is unset.
    #[arg(long, env = "OTEL_TRACES_SAMPLER", help_heading = "Tracing")]
    pub otel_traces_sampler: Option<String>,
    /// The ratio of a traceidratio sampler.
    #[arg(long, env = "OTEL_TRACES_SAMPLER_ARG", help_heading = "Tracing")]
    pub otel_traces_sampler_arg: Option<String>,
    /// service.name when TRACING_SERVICE_NAME is unset.
    #[arg(long, env = "OTEL_SERVICE_NAME", help_heading = "Tracing")]
    pub otel_service_name: Option<String>,
    /// Resource attributes, `key=value,key2=value2` (values percent-decoded).
    #[arg(long, env = "OTEL_RESOURCE_ATTRIBUTES", help_heading = "Tracing")]
    pub otel_resource_attributes: Option<String>,
    /// `grpc`, `http/protobuf` (`http/json` is not supported).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_PROTOCOL", help_heading = "Tracing")]
    pub otel_exporter_otlp_protocol: Option<String>,
    /// The collector's base URL, `http(s)://host:port`; HTTP appends /v1/traces and /v1/metrics.
    /// `host:port`: https for gRPC (http with OTEL_EXPORTER_OTLP_INSECURE=true), http for HTTP.
    /// Default: http://localhost:4318 (http) or http://localhost:4317 (grpc).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", help_heading = "Tracing")]
    pub otel_exporter_otlp_endpoint: Option<String>,
    /// The traces URL, used as is; wins over OTEL_EXPORTER_OTLP_ENDPOINT.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_traces_endpoint: Option<String>,
    /// Headers on every export, `key=value,key2=value2` (values percent-decoded).
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_HEADERS",
        hide_env_values = true,
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_headers: Option<String>,
    /// Headers on trace exports, added to OTEL_EXPORTER_OTLP_HEADERS.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        hide_env_values = true,
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_traces_headers: Option<String>,
    /// Deadline of each export, in milliseconds.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_TIMEOUT",
        default_value_t = 10_000,
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_timeout: u64,
    /// Longest a finished span waits for its batch, in milliseconds.
    #[arg(
        long,
        env = "OTEL_BSP_SCHEDULE_DELAY",
        default_value_t = 5_000,
        help_heading = "Tracing"
    )]
    pub otel_bsp_schedule_delay: u64,
    /// Finished spans waiting for export; past it, spans are dropped (and counted).
    #[arg(
        long,
        env = "OTEL_BSP_MAX_QUEUE_SIZE",
        default_value_t = 2_048,
        help_heading = "Tracing"
    )]
    pub otel_bsp_max_queue_size: usize,
    /// Most spans in one export.
    #[arg(
        long,
        env = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
        default_value_t = 512,
        help_heading = "Tracing"
    )]
    pub otel_bsp_max_export_batch_size: usize,
    /// `otlp` pushes the metrics over OTLP as well; `none` (the default) does not.
    #[arg(long, env = "OTEL_METRICS_EXPORTER", help_heading = "Tracing")]
    pub otel_metrics_exporter: Option<String>,
    /// How often metrics are pushed, in milliseconds.
    #[arg(
        long,
        env = "OTEL_METRIC_EXPORT_INTERVAL",
        default_value_t = 60_000,
        help_heading = "Tracing"
    )]
    pub otel_metric_export_interval: u64,
    /// The metrics URL, used as is; wins over OTEL_EXPORTER_OTLP_ENDPOINT.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_metrics_endpoint: Option<String>,
    /// Headers on metrics exports, added to OTEL_EXPORTER_OTLP_HEADERS.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
        hide_env_values = true,
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_metrics_headers: Option<String>,
    /// Protocol of metrics exports. Default: the traces' protocol.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_metrics_protocol: Option<String>,
    /// PEM CA certificate(s) an `https` collector's certificate must chain to (only
    /// those). Default: the system's roots.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_CERTIFICATE",
        value_name = "PATH",
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_certificate: Option<String>,
    /// PEM client certificate (chain) presented to an `https` collector (mTLS); needs
    /// OTEL_EXPORTER_OTLP_CLIENT_KEY.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
        value_name = "PATH",
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_client_certificate: Option<String>,
    /// PEM private key of OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_CLIENT_KEY",
        value_name = "PATH",
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_client_key: Option<String>,
    /// `true`: a gRPC endpoint without a scheme (`host:port`) is plain text rather than
    /// TLS. No effect on `http://` and `https://` URLs, nor on OTLP/HTTP. Default: false.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_INSECURE",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = parse_go_bool,
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_insecure: Option<bool>,
    /// OTEL_EXPORTER_OTLP_CERTIFICATE for traces exports only; wins over it.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
        value_name = "PATH",
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_traces_certificate: Option<String>,
    /// OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE for traces exports only; wins over it.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
        value_name = "PATH",
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_traces_client_certificate: Option<String>,
    /// OTEL_EXPORTER_OTLP_CLIENT_KEY for traces exports only; wins over it.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
        value_name = "PATH",
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_traces_client_key: Option<String>,
    /// OTEL_EXPORTER_OTLP_INSECURE for traces exports only; wins over it.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = parse_go_bool,
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_traces_insecure: Option<bool>,
    /// OTEL_EXPORTER_OTLP_CERTIFICATE for metrics exports only; wins over it.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE",
        value_name = "PATH",
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_metrics_certificate: Option<String>,
    /// OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE for metrics exports only; wins over it.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE",
        value_name = "PATH",
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_metrics_client_certificate: Option<String>,
    /// OTEL_EXPORTER_OTLP_CLIENT_KEY for metrics exports only; wins over it.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY",
        value_name = "PATH",
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_metrics_client_key: Option<String>,
    /// OTEL_EXPORTER_OTLP_INSECURE for metrics exports only; wins over it.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_METRICS_INSECURE",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = parse_go_bool,
        help_heading = "Tracing"
    )]
    pub otel_exporter_otlp_metrics_insecure: Option<bool>,
}

impl TelemetryArgs {
    /// The OpenTelemetry settings. TRACING_* wins over the matching OTEL_* variable, which is
    /// a fallback, as in envoyproxy/ratelimit. Syntax is checked even when nothing exports,
    /// so a typo shows before someone turns tracing on.
    fn otlp(
        &self,
    ) -> Result<
        (
            Option<crate::telemetry::otlp::TracingOptions>,
            Option<crate::telemetry::otlp::MetricsExportOptions>,
        ),
        SettingsError,
    > {
        use crate::telemetry::otlp::{self, Endpoint, Protocol};
        let none_or_otlp = |var: &'static str, v: &Option<String>| match v.as_deref() {
            None => Ok(false),
            Some(x) if x.eq_ignore_ascii_case("none") => Ok(false),
            Some(x) if x.eq_ignore_ascii_case("otlp") => Ok(true),
            Some(x) => Err(invalid(var, x, "expected otlp or none")),
        };
        let traces_exporter = none_or_otlp("OTEL_TRACES_EXPORTER", &self.otel_traces_exporter)?;
        let metrics_exporter = none_or_otlp("OTEL_METRICS_EXPORTER", &self.otel_metrics_exporter)?;
        let enabled = self.tracing_enabled.unwrap_or(traces_exporter) && !self.otel_sdk_disabled;
        let metrics_enabled = metrics_exporter && !self.otel_sdk_disabled;

        let protocol = |var: &'static str, v: &str| match v.to_ascii_lowercase().as_str() {
            "http" | "http/protobuf" => Ok(Protocol::Http),
            "grpc" => Ok(Protocol::Grpc),
            "http/json" => Err(SettingsError::NotSupportedYet {
                var,
                value: v.to_owned(),
                reason: "OTLP/HTTP with JSON bodies (use http/protobuf or grpc)",
            }),
            _ => Err(invalid(var, v, "expected http (http/protobuf) or grpc")),
        };
        let traces_protocol = match (
            &self.tracing_exporter_protocol,
            &self.otel_exporter_otlp_protocol,
        ) {
            (Some(v), _) => protocol("TRACING_EXPORTER_PROTOCOL", v)?,
            (None, Some(v)) => protocol("OTEL_EXPORTER_OTLP_PROTOCOL", v)?,
            (None, None) => Protocol::Http,
        };
        let metrics_protocol = match &self.otel_exporter_otlp_metrics_protocol {
            Some(v) => protocol("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", v)?,
            None => traces_protocol,
        };

        let rate = match (
            self.tracing_sampling_rate,
            self.otel_traces_sampler.as_deref(),
        ) {
            (Some(r), _) => {
                if !(0.0..=1.0).contains(&r) {
                    return Err(invalid(
                        "TRACING_SAMPLING_RATE",
                        r,
                        "must be between 0 and 1",
                    ));
                }
                r
            }
            (None, None) => 1.0,
            (None, Some(sampler)) => match sampler.to_ascii_lowercase().as_str() {
                "always_on" | "parentbased_always_on" => 1.0,
                "always_off" | "parentbased_always_off" => 0.0,
                "traceidratio" | "parentbased_traceidratio" => {
                    match self.otel_traces_sampler_arg.as_deref() {
                        None => 1.0,
                        Some(arg) => arg
                            .trim()
                            .parse::<f64>()
                            .ok()
                            .filter(|r| (0.0..=1.0).contains(r))
                            .ok_or_else(|| {
                                invalid(
                                    "OTEL_TRACES_SAMPLER_ARG",
                                    arg,
                                    "must be a number between 0 and 1",
                                )
                            })?,
                    }
                }
                _ => {
                    return Err(invalid(
                        "OTEL_TRACES_SAMPLER",
                        sampler,
                        "expected always_on, always_off, traceidratio or their parentbased_ forms",
                    ));
                }
            },
        };

        let mut attrs = match &self.otel_resource_attributes {
            Some(v) => key_values("OTEL_RESOURCE_ATTRIBUTES", v)?,
            None => Vec::new(),
        };
        let mut take = |key: &str| {
            attrs
                .iter()
                .position(|(k, _)| k == key)
                .map(|i| attrs.remove(i).1)
        };
        let from_attrs = (
            take("service.name"),
            take("service.namespace"),
            take("service.instance.id"),
        );
        let non_empty = |v: &Option<String>| v.clone().filter(|s| !s.is_empty());
        let name = non_empty(&self.tracing_service_name)
            .or_else(|| non_empty(&self.otel_service_name))
            .or(from_attrs.0)
            .unwrap_or_else(|| "RateLimit".to_owned());
        let namespace = non_empty(&self.tracing_service_namespace).or(from_attrs.1);
        let instance = non_empty(&self.tracing_service_instance_id)
            .or(from_attrs.2)
            .unwrap_or_else(otlp::random_uuid);
        let mut resource = vec![("service.name".to_owned(), name)];
        if let Some(ns) = namespace {
            resource.push(("service.namespace".to_owned(), ns));
        }
        resource.push(("service.instance.id".to_owned(), instance));
        resource.extend(attrs);
        if !resource.iter().any(|(k, _)| k == "service.version") {
            resource.push((
                "service.version".to_owned(),
                env!("CARGO_PKG_VERSION").to_owned(),
            ));
        }
        resource.push(("telemetry.sdk.name".to_owned(), "sluice".to_owned()));
        resource.push(("telemetry.sdk.language".to_owned(), "rust".to_owned()));

        let headers = |var: &'static str,
                       v: &Option<String>|
         -> Result<Vec<(String, String)>, SettingsError> {
            let pairs = match v {
                Some(v) => key_values(var, v)?,
                None => return Ok(Vec::new()),
            };
            pairs
                .into_iter()
                .map(|(k, v)| {
                    let k = k.to_ascii_lowercase();
                    header_name(var, k.clone())?;
                    if v.bytes().any(|b| b < 0x20 && b != b'\t' || b == 0x7f) {
                        return Err(invalid(var, &k, "a header value holds a control character"));
                    }
                    Ok((k, v))
                })
                .collect()
        };
        let common = headers(
            "OTEL_EXPORTER_OTLP_HEADERS",
            &self.otel_exporter_otlp_headers,
        )?;
        let merge = |own: Vec<(String, String)>| {
            let mut all: Vec<(String, String)> = common
                .iter()
                .filter(|(k, _)| !own.iter().any(|(o, _)| o == k))
                .cloned()
                .collect();
            all.extend(own);
            all
        };
        let trace_headers = merge(headers(
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            &self.otel_exporter_otlp_traces_headers,
        )?);
        let metrics_headers = merge(headers(
            "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
            &self.otel_exporter_otlp_metrics_headers,
        )?);
        if self.otel_exporter_otlp_timeout == 0 {
            return Err(invalid(
                "OTEL_EXPORTER_OTLP_TIMEOUT",
                0,
                "must be at least 1 (milliseconds)",
            ));
        }
        let timeout = Duration::from_millis(self.otel_exporter_otlp_timeout);

        // The signal's own URL is used as is; the base URL gets the signal's path on HTTP.
        let url = |own: (&'static str, &Option<String>),
                   path: &str,
                   protocol: Protocol,
                   insecure: bool| {
            Ok::<_, SettingsError>(match (own.1, &self.otel_exporter_otlp_endpoint) {
                (Some(u), _) => otlp_url(own.0, u, protocol, insecure)?,
                (None, Some(base)) => {
                    let base = otlp_url("OTEL_EXPORTER_OTLP_ENDPOINT", base, protocol, insecure)?;
                    match protocol {
                        Protocol::Http => format!("{}{path}", base.trim_end_matches('/')),
                        Protocol::Grpc => base,
                    }
                }
                (None, None) => match protocol {
                    Protocol::Http => format!("http://localhost:4318{path}"),
                    Protocol::Grpc => "http://localhost:4317".to_owned(),
                },
            })
        };
        let traces_url = url(
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                &self.otel_exporter_otlp_traces_endpoint,
            ),
            "/v1/traces",
            traces_protocol,
            self.otel_exporter_otlp_traces_insecure
                .or(self.otel_exporter_otlp_insecure)
                .unwrap_or(false),
        )?;
        let metrics_url = url(
            (
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                &self.otel_exporter_otlp_metrics_endpoint,
            ),
            "/v1/metrics",
            metrics_protocol,
            self.otel_exporter_otlp_metrics_insecure
                .or(self.otel_exporter_otlp_insecure)
                .unwrap_or(false),
        )?;

        // TLS files: pairs are checked always (a typo shows before export is turned on); the
        // files are read, and checked as every TLS client's are, only when a signal that is
        // on has an https endpoint. With an http endpoint they are not used.
        let traces_files = otlp_tls_files(
            [
                (
                    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
                    &self.otel_exporter_otlp_traces_certificate,
                ),
                (
                    "OTEL_EXPORTER_OTLP_CERTIFICATE",
                    &self.otel_exporter_otlp_certificate,
                ),
            ],
            [
                (
                    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
                    &self.otel_exporter_otlp_traces_client_certificate,
                ),
                (
                    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                    &self.otel_exporter_otlp_client_certificate,
                ),
            ],
            [
                (
                    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
                    &self.otel_exporter_otlp_traces_client_key,
                ),
                (
                    "OTEL_EXPORTER_OTLP_CLIENT_KEY",
                    &self.otel_exporter_otlp_client_key,
                ),
            ],
        )?;
        let metrics_files = otlp_tls_files(
            [
                (
                    "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE",
                    &self.otel_exporter_otlp_metrics_certificate,
                ),
                (
                    "OTEL_EXPORTER_OTLP_CERTIFICATE",
                    &self.otel_exporter_otlp_certificate,
                ),
            ],
            [
                (
                    "OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE",
                    &self.otel_exporter_otlp_metrics_client_certificate,
                ),
                (
                    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                    &self.otel_exporter_otlp_client_certificate,
                ),
            ],
            [
                (
                    "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY",
                    &self.otel_exporter_otlp_metrics_client_key,
                ),
                (
                    "OTEL_EXPORTER_OTLP_CLIENT_KEY",
                    &self.otel_exporter_otlp_client_key,
                ),
            ],
        )?;
        let tls = |used: bool, url: &str, (ca, identity)| {
            if used && url.starts_with("https://") {
                crate::tls::ClientTls::from_files(ca, identity, None).map(Some)
            } else {
                Ok(None)
            }
        };
        let traces_tls = tls(enabled, &traces_url, traces_files)?;
        let metrics_tls = tls(metrics_enabled, &metrics_url, metrics_files)?;
        let queue = non_zero("OTEL_BSP_MAX_QUEUE_SIZE", self.otel_bsp_max_queue_size)?.get();
        let batch = non_zero(
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
            self.otel_bsp_max_export_batch_size,
        )?
        .get();
        if self.otel_bsp_schedule_delay == 0 {
            return Err(invalid(
                "OTEL_BSP_SCHEDULE_DELAY",
                0,
                "must be at least 1 (milliseconds)",
            ));
        }
        if self.otel_metric_export_interval == 0 {
            return Err(invalid(
                "OTEL_METRIC_EXPORT_INTERVAL",
                0,
                "must be at least 1 (milliseconds)",
            ));
        }
        let tracing = enabled.then(|| otlp::TracingOptions {
            endpoint: Endpoint {
                protocol: traces_protocol,
                url: traces_url,
                tls: traces_tls,
                headers: trace_headers,
                timeout,
            },
            sampling_rate: rate,
            resource: resource.clone(),
            max_queue_size: queue,
            max_batch_size: batch.min(queue),
            schedule_delay: Duration::from_millis(self.otel_bsp_schedule_delay),
        });
        let metrics = metrics_enabled.then(|| otlp::MetricsExportOptions {
            endpoint: Endpoint {
                protocol: metrics_protocol,
                url: metrics_url,
                tls: metrics_tls,
                headers: metrics_headers,
                timeout,
            },
            interval: Duration::from_millis(self.otel_metric_export_interval),
            resource,
        });
        Ok((tracing, metrics))
    }

    fn validate(&self, near_limit_ratio: f32) -> Result<TelemetryOptions, SettingsError> {
        let max_keys = non_zero("SLUICE_MAX_STAT_KEYS", self.max_stat_keys)?.get();
        if !self.prometheus_path.starts_with('/') {
            return Err(invalid(
                "PROMETHEUS_PATH",
                &self.prometheus_path,
                "must start with /",
            ));
        }
        let statsd = if self.use_statsd {
            let interval = parse_go_duration(&self.stats_flush_interval)
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    invalid(
                        "STATS_FLUSH_INTERVAL",
                        &self.stats_flush_interval,
                        "expected a positive Go duration such as 10s",
                    )
                })?;
            let addr = (self.statsd_host.as_str(), self.statsd_port)
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| invalid("STATSD_HOST", &self.statsd_host, "cannot be resolved"))?;
            Some((addr, interval))
        } else {
            None
        };
        let (tracing, otlp_metrics) = self.otlp()?;
        Ok(TelemetryOptions {
            tracing,
            otlp_metrics,
            statsd,
            stats: crate::telemetry::StatsOptions {
                enabled: !self.disable_stats,
                near_limit_ratio,
                max_keys,
            },
            prometheus_path: self.prometheus_path.clone(),
        })
    }

    /// USE_PROMETHEUS: where the exposition gets its own listener. Go's `:9090` means every
    /// interface.
    fn prometheus_addr(&self) -> Result<Option<SocketAddr>, SettingsError> {
        if !self.use_prometheus {
            return Ok(None);
        }
        let (host, port) = self.prometheus_addr.rsplit_once(':').ok_or_else(|| {
            invalid(
                "PROMETHEUS_ADDR",
                &self.prometheus_addr,
                "expected host:port or :port",
            )
        })?;
        let port: u16 = port.parse().map_err(|_| {
            invalid(
                "PROMETHEUS_ADDR",
                &self.prometheus_addr,
                "the port is not a number",
            )
        })?;
        let host = if host.is_empty() { "0.0.0.0" } else { host };
        resolve_listener("PROMETHEUS_ADDR", host, port).map(Some)
    }
}

/// The integration tests' throw-away CA, for the REDIS_TLS_* files.
#[cfg(test)]
#[path = "../integration/pki.rs"]
mod test_pki;

#[cfg(test)]
mod tests {
    use super::*;

    /// Parse with every environment variable ignored, so tests see only their own arguments
    /// whatever the environment of the test runner holds.
    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        let cmd = ignore_empty_env(Cli::command(), &|_| true);
        parse_with(cmd, std::iter::once("sluice").chain(args.iter().copied()))
    }

    fn serve(args: &[&str]) -> ServeArgs {
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

    fn redis_error(extra: &[&str]) -> String {
        let mut args = vec!["--backend-type", "redis", "--redis-url", "127.0.0.1:6379"];
        args.extend_from_slice(extra);
        error(&args)
    }

    #[test]
    fn grpc_connection_age_defaults_to_go_and_parses_go_durations() {
        let s = settings(&[]).unwrap();
        assert_eq!(
            s.app.grpc_connection_age,
            Some(crate::net::ConnectionAge {
                max_age: Duration::from_secs(24 * 3600),
                grace: Some(Duration::from_secs(3600)),
            })
        );
        let s = settings(&[
            "--grpc-max-connection-age",
            "1m30s",
            "--grpc-max-connection-age-grace",
            "250ms",
        ])
        .unwrap();
        assert_eq!(
            s.app.grpc_connection_age,
            Some(crate::net::ConnectionAge {
                max_age: Duration::from_secs(90),
                grace: Some(Duration::from_millis(250)),
            })
        );
        // grpc-go reads 0 as "for ever", for both.
        let s = settings(&["--grpc-max-connection-age", "0"]).unwrap();
        assert_eq!(s.app.grpc_connection_age, None);
        let s = settings(&["--grpc-max-connection-age-grace", "0"]).unwrap();
        assert_eq!(s.app.grpc_connection_age.map(|a| a.grace), Some(None));
        let err = error(&["--grpc-max-connection-age", "24"]);
        assert!(err.starts_with("GRPC_MAX_CONNECTION_AGE=24: "), "{err}");
        let err = error(&["--grpc-max-connection-age-grace=-1s"]);
        assert!(
            err.starts_with("GRPC_MAX_CONNECTION_AGE_GRACE=-1s: "),
            "{err}"
        );
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

    #[test]
    fn go_variables_sluice_cannot_honour_stop_start_up() {
        for (args, start) in [
            (&["--extra-tags", "env:prod"][..], "EXTRA_TAGS=env:prod: "),
            (
                &["--prometheus-response-time-as-milliseconds=true"][..],
                "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS=true: ",
            ),
            (
                &["--prometheus-mapper-yaml", "/etc/mapper.yaml"][..],
                "PROMETHEUS_MAPPER_YAML=/etc/mapper.yaml: ",
            ),
            (&["--use-dog-statsd"][..], "USE_DOG_STATSD=true: "),
        ] {
            let err = error(args);
            assert!(err.starts_with(start), "{args:?}: {err}");
            assert!(err.contains("not support"), "{args:?}: {err}");
        }
        // Their off values (and empty values) are the Go defaults and are fine.
        let s = settings(&[
            "--grpc-uds",
            "",
            "--redis-health-check-active-connection=false",
            "--prometheus-response-time-as-milliseconds=false",
            "--use-dog-statsd=false",
            "--use-dog-statsd-mogrifiers",
            "x",
        ]);
        assert!(s.is_ok(), "{s:?}");
    }

    #[test]
    fn grpc_uds_is_a_path_and_refused_with_tls() {
        assert_eq!(settings(&[]).unwrap().addrs.grpc_uds, None);
        assert_eq!(settings(&["--grpc-uds", ""]).unwrap().addrs.grpc_uds, None);
        assert_eq!(
            settings(&["--grpc-uds", "/tmp/rl.sock"])
                .unwrap()
                .addrs
                .grpc_uds,
            Some(PathBuf::from("/tmp/rl.sock"))
        );
        let err = error(&[
            "--grpc-uds",
            "/tmp/rl.sock",
            "--grpc-server-use-tls",
            "--grpc-server-tls-cert",
            "/c.pem",
            "--grpc-server-tls-key",
            "/k.pem",
        ]);
        assert!(
            err.starts_with("GRPC_UDS=/tmp/rl.sock: ") && err.contains("TLS"),
            "{err}"
        );
    }

    #[test]
    fn memcache_variables_are_accepted_and_ignored() {
        // The Go service reads them only with BACKEND_TYPE=memcache, which Sluice refuses.
        let s = settings(&[
            "--memcache-host-port",
            "m1:11211,m2:11211",
            "--memcache-max-idle-conns",
            "4",
            "--memcache-srv",
            "_memcache._tcp.example",
            "--memcache-srv-refresh",
            "1m",
            "--memcache-tls",
            "true",
            "--memcache-tls-client-cert",
            "/missing.crt",
            "--memcache-tls-client-key",
            "/missing.key",
            "--memcache-tls-cacert",
            "/missing.ca",
            "--memcache-tls-skip-hostname-verification",
            "true",
        ]);
        assert!(s.is_ok(), "{s:?}");
    }

    #[test]
    fn every_new_go_variable_is_a_flag_with_its_env_var() {
        let cmd = Cli::command();
        for var in [
            "GRPC_UDS",
            "GRPC_MAX_CONNECTION_AGE",
            "GRPC_MAX_CONNECTION_AGE_GRACE",
            "REDIS_STARTUP_INITIAL_INTERVAL",
            "REDIS_STARTUP_MAX_INTERVAL",
            "REDIS_STARTUP_MAX_ELAPSED_TIME",
            "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
            "REDIS_CLUSTER_PIPELINE_PARALLELISM",
            "REDIS_POOL_ON_EMPTY_BEHAVIOR",
            "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
            "REDIS_PERSECOND_POOL_SIZE",
            "REDIS_PERSECOND_PIPELINE_WINDOW",
            "REDIS_PERSECOND_PIPELINE_LIMIT",
            "REDIS_PIPELINE_LIMIT",
            "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
            "PROMETHEUS_MAPPER_YAML",
            "EXTRA_TAGS",
            "USE_DOG_STATSD",
            "USE_DOG_STATSD_MOGRIFIERS",
            "MEMCACHE_HOST_PORT",
            "MEMCACHE_MAX_IDLE_CONNS",
            "MEMCACHE_SRV",
            "MEMCACHE_SRV_REFRESH",
            "MEMCACHE_TLS",
            "MEMCACHE_TLS_CLIENT_CERT",
            "MEMCACHE_TLS_CLIENT_KEY",
            "MEMCACHE_TLS_CACERT",
            "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
        ] {
            let arg = cmd
                .get_arguments()
                .find(|a| a.get_env().is_some_and(|e| e == var));
            let arg = arg.unwrap_or_else(|| panic!("{var} is not parsed"));
            assert!(arg.get_long().is_some() && !arg.is_hide_set(), "{var}");
        }
    }

    fn redis_settings(args: &[&str]) -> RedisConfig {
        match settings(args).unwrap().app.backend {
            Backend::Redis(r) => *r,
            Backend::Memory => panic!("expected the Redis backend"),
        }
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
                master_userinfo: ":master-pass@".into(),
            }
        );
        assert_eq!(
            r.main.urls,
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
                master_userinfo: "u:p@".into(),
            }
        );
        assert_eq!(ps.urls, ["redis://:sp@127.0.0.1:26379"]);
    }

    #[test]
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
            Backend::Memory => panic!("expected the Redis backend"),
        };
        assert_eq!(r.main.urls, ["rediss://127.0.0.1:6380"]);
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
        assert_eq!(r.main.urls, ["rediss://:pw@10.0.0.1:6380"]);
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
        assert_eq!(r.main.urls, ["redis://127.0.0.1:6379"]);

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
        assert_eq!(ps.urls, ["rediss://127.0.0.1:6380"]);
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
            r.main.urls,
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
            r.main.urls,
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
        assert_eq!(r.main.urls, ["redis://a:1", "redis://b:2"]);
        assert_eq!(r.main.topology, RedisTopology::Cluster);
        let err = error(&["--backend-type", "memcache"]);
        assert!(
            err.starts_with("BACKEND_TYPE=memcache: ") && err.contains("not supported"),
            "{err}"
        );
        assert_eq!(
            error(&["--backend-type", "etcd"]),
            "BACKEND_TYPE=etcd: unknown backend; expected memory or redis"
        );
        assert!(error(&["--backend-failure", "maybe"]).starts_with("SLUICE_BACKEND_FAILURE=maybe"));
    }

    #[test]
    fn grpc_server_tls_names_its_files_and_checks_the_san() {
        assert_eq!(settings(&[]).unwrap().grpc_tls, None);
        // Files without GRPC_SERVER_USE_TLS are ignored, as in the Go service.
        assert_eq!(
            settings(&["--grpc-server-tls-cert", "/nowhere"])
                .unwrap()
                .grpc_tls,
            None
        );
        let tls = settings(&[
            "--grpc-server-use-tls=true",
            "--grpc-server-tls-cert",
            "/certs/tls.crt",
            "--grpc-server-tls-key",
            "/certs/tls.key",
            "--grpc-client-tls-cacert",
            "/certs/ca.crt",
            "--grpc-client-tls-san",
            "envoy.example",
        ])
        .unwrap()
        .grpc_tls;
        assert_eq!(
            tls,
            Some(GrpcTlsFiles {
                cert: "/certs/tls.crt".into(),
                key: "/certs/tls.key".into(),
                client_ca: Some("/certs/ca.crt".into()),
                client_san: Some("envoy.example".into()),
            })
        );
        assert_eq!(
            error(&["--grpc-server-use-tls=true"]),
            "GRPC_SERVER_TLS_CERT=: must name a PEM file when GRPC_SERVER_USE_TLS is true"
        );
        assert_eq!(
            error(&[
                "--grpc-server-use-tls=true",
                "--grpc-server-tls-cert",
                "c.pem"
            ]),
            "GRPC_SERVER_TLS_KEY=: must name a PEM file when GRPC_SERVER_USE_TLS is true"
        );
        let base = [
            "--grpc-server-use-tls=true",
            "--grpc-server-tls-cert",
            "c.pem",
            "--grpc-server-tls-key",
            "k.pem",
        ];
        let with = |extra: &[&str]| {
            let mut args = base.to_vec();
            args.extend_from_slice(extra);
            error(&args)
        };
        assert!(
            with(&["--grpc-client-tls-san", "envoy"])
                .starts_with("GRPC_CLIENT_TLS_SAN=envoy: needs GRPC_CLIENT_TLS_CACERT"),
        );
        assert_eq!(
            with(&[
                "--grpc-client-tls-cacert",
                "ca.pem",
                "--grpc-client-tls-san",
                "a b"
            ]),
            "GRPC_CLIENT_TLS_SAN=a b: expected a DNS name or an IP address"
        );
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

    #[test]
    fn config_type_selects_xds_with_go_defaults() {
        assert_eq!(settings(&[]).unwrap().config.xds, None);
        assert_eq!(
            settings(&["--config-type", "file"]).unwrap().config.xds,
            None
        );
        // xDS variables are ignored (not even checked) for files.
        assert_eq!(
            settings(&["--config-grpc-xds-server-use-tls=true"])
                .unwrap()
                .config
                .xds,
            None
        );
        let x = settings(&["--config-type", "GRPC_XDS_SOTW"])
            .unwrap()
            .config
            .xds
            .expect("xds");
        assert_eq!(
            x,
            XdsConfig {
                node_id: "default".into(),
                node_metadata: vec![],
                server_uri: "http://localhost:18000".into(),
                connect_retry_interval: Duration::from_secs(3),
                additional_headers: vec![],
                backoff: XdsBackoff {
                    initial: Duration::from_secs(10),
                    max: Duration::from_secs(60),
                    random_factor: 0.5,
                    jitter: true,
                },
                max_msg_size: None,
                tls: None,
            }
        );
        let xds = |extra: &[&str]| {
            let mut args = vec!["--config-type", "GRPC_XDS_SOTW"];
            args.extend_from_slice(extra);
            settings(&args).map(|s| s.config.xds.expect("xds"))
        };
        let x = xds(&[
            "--config-grpc-xds-node-id",
            "envoy-ratelimit",
            "--config-grpc-xds-node-metadata",
            "zone=a, team=x=y,",
            "--config-grpc-xds-server-url",
            "envoy-gateway:18001",
            "--config-grpc-xds-client-additional-headers",
            "X-Token:abc,tenant=t1",
            "--xds-client-backoff-jitter=false",
            "--xds-client-max-msg-size-in-bytes",
            "8388608",
        ])
        .unwrap();
        assert_eq!(x.node_id, "envoy-ratelimit");
        assert_eq!(
            x.node_metadata,
            vec![("zone".into(), "a".into()), ("team".into(), "x=y".into())]
        );
        assert_eq!(x.server_uri, "http://envoy-gateway:18001");
        assert_eq!(
            x.additional_headers,
            vec![
                ("x-token".into(), "abc".into()),
                ("tenant".into(), "t1".into())
            ]
        );
        assert!(!x.backoff.jitter);
        assert_eq!(x.max_msg_size, Some(8 << 20));

        let err = |extra: &[&str]| xds(extra).unwrap_err().to_string();
        assert_eq!(
            error(&["--config-type", "rest"]),
            "CONFIG_TYPE=rest: expected FILE or GRPC_XDS_SOTW"
        );
        // TLS: the flag or an https:// URL; the files are named here and read at start-up.
        let x = xds(&[
            "--config-grpc-xds-server-use-tls=true",
            "--config-grpc-xds-server-url",
            "envoy-gateway:18001",
            "--config-grpc-xds-client-tls-cert",
            "/certs/tls.crt",
            "--config-grpc-xds-client-tls-key",
            "/certs/tls.key",
            "--config-grpc-xds-server-tls-cacert",
            "/certs/ca.crt",
        ])
        .unwrap();
        assert_eq!(x.server_uri, "https://envoy-gateway:18001");
        assert_eq!(
            x.tls,
            Some(XdsTlsFiles {
                client_identity: Some(("/certs/tls.crt".into(), "/certs/tls.key".into())),
                server_ca: Some("/certs/ca.crt".into()),
                server_name: None,
            })
        );
        let x = xds(&[
            "--config-grpc-xds-server-url",
            "https://cp:18000",
            "--config-grpc-xds-server-tls-san",
            "cp.example",
            "--config-grpc-xds-server-tls-cacert",
            "",
        ])
        .unwrap();
        assert_eq!(x.server_uri, "https://cp:18000");
        assert_eq!(
            x.tls,
            Some(XdsTlsFiles {
                client_identity: None,
                server_ca: None,
                server_name: Some("cp.example".into()),
            })
        );
        // Files named without TLS are ignored, as in the Go service.
        let x = xds(&["--config-grpc-xds-server-tls-cacert", "/certs/ca.crt"]).unwrap();
        assert_eq!(
            (x.server_uri.as_str(), x.tls),
            ("http://localhost:18000", None)
        );
        assert_eq!(
            err(&[
                "--config-grpc-xds-server-use-tls=true",
                "--config-grpc-xds-client-tls-cert",
                "/certs/tls.crt",
            ]),
            "CONFIG_GRPC_XDS_CLIENT_TLS_CERT=/certs/tls.crt: needs \
             CONFIG_GRPC_XDS_CLIENT_TLS_KEY, the certificate's private key"
        );
        assert_eq!(
            err(&[
                "--config-grpc-xds-server-use-tls=true",
                "--config-grpc-xds-server-tls-san",
                "not a name",
            ]),
            "CONFIG_GRPC_XDS_SERVER_TLS_SAN=not a name: expected a DNS name or an IP address"
        );
        assert_eq!(
            err(&["--config-grpc-xds-server-url", "cp"]),
            "CONFIG_GRPC_XDS_SERVER_URL=cp: expected host:port"
        );
        assert_eq!(
            err(&["--config-grpc-xds-node-metadata", "zone"]),
            "CONFIG_GRPC_XDS_NODE_METADATA=zone: expected key=value"
        );
        assert!(
            err(&["--config-grpc-xds-client-additional-headers", "k-bin:x"])
                .starts_with("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS=k-bin:")
        );
        assert!(
            err(&["--config-grpc-xds-server-connect-retry-interval", "3"])
                .starts_with("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL=3:")
        );
        assert!(
            err(&["--xds-client-backoff-max-interval", "1s"])
                .starts_with("XDS_CLIENT_BACKOFF_MAX_INTERVAL=1s: must not be shorter")
        );
        assert!(
            err(&["--xds-client-backoff-random-factor", "1.5"])
                .starts_with("XDS_CLIENT_BACKOFF_RANDOM_FACTOR=1.5:")
        );
    }

    #[test]
    fn tracing_is_off_by_default_and_defaults_match_go() {
        let s = settings(&[]).unwrap();
        assert_eq!(s.app.telemetry.tracing, None);
        assert_eq!(s.app.telemetry.otlp_metrics, None);
        let t = settings(&["--tracing-enabled"])
            .unwrap()
            .app
            .telemetry
            .tracing
            .unwrap();
        assert_eq!(t.endpoint.protocol, crate::telemetry::otlp::Protocol::Http);
        assert_eq!(t.endpoint.url, "http://localhost:4318/v1/traces");
        assert_eq!(t.endpoint.timeout, Duration::from_secs(10));
        assert_eq!(t.sampling_rate, 1.0);
        assert_eq!(t.resource[0], ("service.name".into(), "RateLimit".into()));
        assert_eq!(t.resource[1].0, "service.instance.id");
        assert_eq!(t.resource[1].1.len(), 36, "a random UUID");
    }

    #[test]
    fn tracing_variables_win_over_otel_ones_which_fill_in() {
        let t = settings(&[
            "--tracing-enabled=true",
            "--tracing-exporter-protocol=grpc",
            "--otel-exporter-otlp-endpoint=127.0.0.1:4317",
            "--otel-exporter-otlp-headers=Authorization=Basic%20eA==, x-tenant = acme",
            "--otel-service-name=otel-name",
            "--otel-resource-attributes=service.namespace=prod,deployment.environment=eu",
            "--tracing-sampling-rate=0.25",
        ])
        .unwrap()
        .app
        .telemetry
        .tracing
        .unwrap();
        assert_eq!(t.endpoint.protocol, crate::telemetry::otlp::Protocol::Grpc);
        // A gRPC endpoint without a scheme is TLS, as OTEL_EXPORTER_OTLP_INSECURE=false says.
        assert_eq!(t.endpoint.url, "https://127.0.0.1:4317");
        assert_eq!(t.endpoint.tls, Some(crate::tls::ClientTls::default()));
        assert_eq!(
            t.endpoint.headers,
            vec![
                ("authorization".to_string(), "Basic eA==".to_string()),
                ("x-tenant".to_string(), "acme".to_string())
            ]
        );
        assert_eq!(t.sampling_rate, 0.25);
        let attr = |k: &str| {
            t.resource
                .iter()
                .find(|(a, _)| a == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(attr("service.name"), Some("otel-name"));
        assert_eq!(attr("service.namespace"), Some("prod"));
        assert_eq!(attr("deployment.environment"), Some("eu"));

        let t = settings(&[
            "--otel-traces-exporter=otlp",
            "--tracing-service-name=mine",
            "--otel-service-name=otel-name",
            "--otel-exporter-otlp-protocol=http/protobuf",
            "--otel-exporter-otlp-endpoint=http://collector:4318/",
            "--otel-traces-sampler=parentbased_traceidratio",
            "--otel-traces-sampler-arg=0.5",
            "--otel-metrics-exporter=otlp",
            "--otel-metric-export-interval=1000",
        ])
        .unwrap()
        .app
        .telemetry;
        let (tracing, metrics) = (t.tracing.unwrap(), t.otlp_metrics.unwrap());
        assert_eq!(tracing.endpoint.url, "http://collector:4318/v1/traces");
        assert_eq!(tracing.sampling_rate, 0.5);
        assert_eq!(tracing.resource[0].1, "mine");
        assert_eq!(metrics.endpoint.url, "http://collector:4318/v1/metrics");
        assert_eq!(metrics.interval, Duration::from_secs(1));

        let t = settings(&["--otel-traces-exporter=otlp", "--otel-sdk-disabled"]).unwrap();
        assert_eq!(t.app.telemetry.tracing, None);
    }

    #[test]
    fn bad_tracing_settings_name_the_variable() {
        for (args, expected) in [
            (
                &["--tracing-sampling-rate=1.5"][..],
                "TRACING_SAMPLING_RATE=1.5",
            ),
            (
                &["--tracing-exporter-protocol=udp"][..],
                "TRACING_EXPORTER_PROTOCOL=udp",
            ),
            (
                &["--otel-exporter-otlp-protocol=http/json"][..],
                "not support it yet",
            ),
            (
                &["--otel-exporter-otlp-headers=novalue"][..],
                "OTEL_EXPORTER_OTLP_HEADERS=novalue",
            ),
            (
                &["--otel-exporter-otlp-headers=a b=c"][..],
                "OTEL_EXPORTER_OTLP_HEADERS=",
            ),
            (
                &["--otel-resource-attributes==x"][..],
                "OTEL_RESOURCE_ATTRIBUTES",
            ),
            (
                &["--otel-traces-sampler=sometimes"][..],
                "OTEL_TRACES_SAMPLER=sometimes",
            ),
            (
                &["--otel-metrics-exporter=prometheus"][..],
                "OTEL_METRICS_EXPORTER=prometheus",
            ),
            (
                &["--otel-exporter-otlp-timeout=0"][..],
                "OTEL_EXPORTER_OTLP_TIMEOUT=0",
            ),
            (
                &[
                    "--tracing-enabled",
                    "--otel-exporter-otlp-traces-endpoint=ftp://x",
                ][..],
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=ftp://x",
            ),
        ] {
            let err = error(args);
            assert!(err.contains(expected), "{args:?}: {err}");
        }
        // Parse errors (before validation) name the variable too.
        let err = parse(&["--tracing-sampling-rate=lots"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("TRACING_SAMPLING_RATE"), "{err}");
    }

    /// OTEL_EXPORTER_OTLP_*HEADERS and OTEL_RESOURCE_ATTRIBUTES values go through the one
    /// strict percent-decoder: `%+f` (once read as 0x0f) stops start-up naming the variable.
    #[test]
    fn percent_encoded_values_take_two_hex_digits() {
        let traces = settings(&[
            "--tracing-enabled",
            "--otel-exporter-otlp-headers=x-key=a%20b",
            "--otel-resource-attributes=team=a%2Cb",
        ])
        .unwrap()
        .app
        .telemetry
        .tracing
        .unwrap();
        assert_eq!(
            traces.endpoint.headers,
            [("x-key".to_owned(), "a b".to_owned())]
        );
        assert!(
            traces
                .resource
                .contains(&("team".to_owned(), "a,b".to_owned()))
        );
        let why = "the value is not valid percent-encoded UTF-8 (a % takes two hex digits)";
        for (var, item) in [
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-key=%+f"),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-key=%+f"),
            ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "x-key=%+f"),
            ("OTEL_RESOURCE_ATTRIBUTES", "team=%+f"),
        ] {
            let flag = format!("--{}={item}", var.to_ascii_lowercase().replace('_', "-"));
            assert_eq!(error(&[&flag]), format!("{var}={item}: {why}"));
        }
    }

    #[test]
    fn otlp_endpoints_take_tls_from_their_scheme_and_insecure() {
        use crate::telemetry::otlp::Protocol;
        let traces = |args: &[&str]| {
            let mut all = vec!["--tracing-enabled"];
            all.extend_from_slice(args);
            settings(&all)
                .unwrap()
                .app
                .telemetry
                .tracing
                .unwrap()
                .endpoint
        };
        // https: TLS with the system's roots and no client certificate.
        let e = traces(&["--otel-exporter-otlp-endpoint=https://collector:4318"]);
        assert_eq!(e.url, "https://collector:4318/v1/traces");
        assert_eq!(e.tls, Some(crate::tls::ClientTls::default()));
        // http: plain text; TLS files are not read (so not needed) for it.
        let e = traces(&[
            "--otel-exporter-otlp-endpoint=http://collector:4318",
            "--otel-exporter-otlp-certificate=/nonexistent/ca.pem",
        ]);
        assert_eq!(e.url, "http://collector:4318/v1/traces");
        assert_eq!(e.tls, None);
        // No scheme: OTLP/HTTP means http; gRPC means https unless INSECURE, and the signal's
        // own INSECURE wins over the common one. INSECURE never turns an https URL plain.
        assert_eq!(
            traces(&["--otel-exporter-otlp-endpoint=collector:4318"]).url,
            "http://collector:4318/v1/traces"
        );
        let grpc = "--tracing-exporter-protocol=grpc";
        for (args, url) in [
            (
                &[grpc, "--otel-exporter-otlp-endpoint=c:4317"][..],
                "https://c:4317",
            ),
            (
                &[
                    grpc,
                    "--otel-exporter-otlp-endpoint=c:4317",
                    "--otel-exporter-otlp-insecure",
                ][..],
                "http://c:4317",
            ),
            (
                &[
                    grpc,
                    "--otel-exporter-otlp-endpoint=c:4317",
                    "--otel-exporter-otlp-insecure=true",
                    "--otel-exporter-otlp-traces-insecure=false",
                ][..],
                "https://c:4317",
            ),
            (
                &[
                    grpc,
                    "--otel-exporter-otlp-traces-endpoint=c:4317",
                    "--otel-exporter-otlp-traces-insecure=true",
                ][..],
                "http://c:4317",
            ),
            (
                &[
                    grpc,
                    "--otel-exporter-otlp-endpoint=https://c:4317",
                    "--otel-exporter-otlp-insecure=true",
                ][..],
                "https://c:4317",
            ),
            // The default endpoint is http://localhost:4317, plain text as before.
            (&[grpc][..], "http://localhost:4317"),
        ] {
            let e = traces(args);
            assert_eq!(e.protocol, Protocol::Grpc);
            assert_eq!(e.url, url, "{args:?}");
            assert_eq!(e.tls.is_some(), url.starts_with("https"), "{args:?}");
        }
        // Metrics read their own INSECURE.
        let m = settings(&[
            "--otel-metrics-exporter=otlp",
            "--otel-exporter-otlp-metrics-protocol=grpc",
            "--otel-exporter-otlp-endpoint=c:4317",
            "--otel-exporter-otlp-metrics-insecure",
        ])
        .unwrap()
        .app
        .telemetry
        .otlp_metrics
        .unwrap();
        assert_eq!(m.endpoint.url, "http://c:4317");
    }

    #[test]
    fn otlp_tls_files_are_read_per_signal_and_checked_before_start() {
        let pki = test_pki::TestPki::new();
        let leaf = pki.leaf("client", &["localhost"]);
        let other = pki.leaf("other", &["localhost"]);
        let path = |p: &std::path::Path| p.to_str().unwrap().to_owned();
        let (ca, cert, key) = (path(&pki.ca), path(&leaf.cert), path(&leaf.key));
        let read = |p: &str| std::fs::read(p).unwrap();
        let both = [
            "--tracing-enabled",
            "--otel-metrics-exporter=otlp",
            "--otel-exporter-otlp-endpoint=https://collector:4318",
        ];
        let run = |extra: &[&str]| {
            let args: Vec<&str> = both.iter().chain(extra).copied().collect();
            settings(&args)
        };

        // The common variables serve both signals.
        let t = run(&[
            &format!("--otel-exporter-otlp-certificate={ca}"),
            &format!("--otel-exporter-otlp-client-certificate={cert}"),
            &format!("--otel-exporter-otlp-client-key={key}"),
        ])
        .unwrap()
        .app
        .telemetry;
        let expected = crate::tls::ClientTls {
            ca_pem: Some(read(&ca)),
            identity_pem: Some((read(&cert), read(&key))),
            server_name: None,
        };
        assert_eq!(t.tracing.unwrap().endpoint.tls.as_ref(), Some(&expected));
        assert_eq!(t.otlp_metrics.unwrap().endpoint.tls, Some(expected.clone()));
        // A key never shows in a debug print.
        assert!(!format!("{expected:?}").contains("PRIVATE KEY"));

        // A signal's own variables win, each on its own: the traces' CA and client pair, the
        // metrics' key with the common certificate.
        let (other_cert, other_key) = (path(&other.cert), path(&other.key));
        let t = run(&[
            "--otel-exporter-otlp-certificate=/nonexistent/common-ca.pem",
            &format!("--otel-exporter-otlp-traces-certificate={ca}"),
            &format!("--otel-exporter-otlp-metrics-certificate={ca}"),
            &format!("--otel-exporter-otlp-client-certificate={cert}"),
            &format!("--otel-exporter-otlp-client-key={other_key}"),
            &format!("--otel-exporter-otlp-traces-client-certificate={other_cert}"),
            &format!("--otel-exporter-otlp-metrics-client-key={key}"),
        ])
        .unwrap()
        .app
        .telemetry;
        let tls = t.tracing.unwrap().endpoint.tls.unwrap();
        assert_eq!(tls.ca_pem, Some(read(&ca)));
        assert_eq!(
            tls.identity_pem,
            Some((read(&other_cert), read(&other_key)))
        );
        let tls = t.otlp_metrics.unwrap().endpoint.tls.unwrap();
        assert_eq!(tls.identity_pem, Some((read(&cert), read(&key))));

        // Errors name the variable (the signal's own when it is the one set) and the file.
        let err = |extra: &[&str]| run(extra).unwrap_err().to_string();
        let e = err(&["--otel-exporter-otlp-certificate=/nonexistent/ca.pem"]);
        assert!(
            e.starts_with(
                "OTEL_EXPORTER_OTLP_CERTIFICATE=/nonexistent/ca.pem: cannot read the file: "
            ),
            "{e}"
        );
        let e = err(&["--otel-exporter-otlp-metrics-certificate=/nonexistent/ca.pem"]);
        assert!(
            e.starts_with(
                "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE=/nonexistent/ca.pem: cannot read"
            ),
            "{e}"
        );
        assert_eq!(
            err(&[&format!("--otel-exporter-otlp-certificate={key}")]),
            format!(
                "OTEL_EXPORTER_OTLP_CERTIFICATE={key}: no PEM certificate (BEGIN CERTIFICATE) in the file"
            )
        );
        assert_eq!(
            err(&[&format!("--otel-exporter-otlp-client-certificate={cert}")]),
            format!(
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE={cert}: needs OTEL_EXPORTER_OTLP_CLIENT_KEY, the certificate's private key"
            )
        );
        assert_eq!(
            err(&[&format!(
                "--otel-exporter-otlp-traces-client-certificate={cert}"
            )]),
            format!(
                "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE={cert}: needs OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY, the certificate's private key"
            )
        );
        assert_eq!(
            err(&[&format!("--otel-exporter-otlp-metrics-client-key={key}")]),
            format!(
                "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY={key}: needs OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE, the certificate of this key"
            )
        );
        assert_eq!(
            err(&[
                &format!("--otel-exporter-otlp-client-certificate={cert}"),
                &format!("--otel-exporter-otlp-client-key={other_key}"),
            ]),
            format!(
                "OTEL_EXPORTER_OTLP_CLIENT_KEY={other_key}: the private key does not match the certificate in OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE={cert}"
            )
        );
        let e = err(&[
            &format!("--otel-exporter-otlp-client-certificate={cert}"),
            "--otel-exporter-otlp-client-key=/nonexistent/key.pem",
        ]);
        assert!(
            e.starts_with(
                "OTEL_EXPORTER_OTLP_CLIENT_KEY=/nonexistent/key.pem: cannot read the file"
            ),
            "{e}"
        );
        // A half pair is refused even with export off; files are only read when used.
        let e = settings(&[&format!("--otel-exporter-otlp-client-key={key}")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("needs OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"),
            "{e}"
        );
        assert!(settings(&["--otel-exporter-otlp-certificate=/nonexistent/ca.pem"]).is_ok());
        // Bad schemes name their variable.
        let e = error(&["--tracing-enabled", "--otel-exporter-otlp-endpoint=ftp://x"]);
        assert!(
            e.contains("OTEL_EXPORTER_OTLP_ENDPOINT=ftp://x: expected an http:// or https:// URL"),
            "{e}"
        );
    }

    #[test]
    fn go_durations_parse() {
        assert_eq!(parse_go_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_go_duration("150us"), Some(Duration::from_micros(150)));
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_go_duration("10"), None);
        assert_eq!(parse_go_duration(""), None);
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
    fn log_settings_accept_logrus_spellings() {
        let level = |l: &str| settings(&["--log-level", l]).map(|s| s.log_level);
        assert_eq!(level("TRACE").unwrap(), LogLevel::Trace);
        assert_eq!(level("debug").unwrap(), LogLevel::Debug);
        assert_eq!(level("Info").unwrap(), LogLevel::Info);
        assert_eq!(level("warning").unwrap(), LogLevel::Warn);
        assert_eq!(level("error").unwrap(), LogLevel::Error);
        assert_eq!(level("FATAL").unwrap(), LogLevel::Error);
        assert_eq!(level("panic").unwrap(), LogLevel::Error);
        assert!(
            level("loud")
                .unwrap_err()
                .to_string()
                .starts_with("LOG_LEVEL=loud:")
        );

        let format = |f: &str| settings(&["--log-format", f]).map(|s| s.log_format);
        assert_eq!(format("JSON").unwrap(), LogFormat::Json);
        assert_eq!(format("text").unwrap(), LogFormat::Text);
        assert_eq!(
            format("xml").unwrap_err().to_string(),
            "LOG_FORMAT=xml: expected text or json"
        );
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
            }) => {
                assert_eq!(path, PathBuf::from("/etc/ratelimit/config"));
                assert!(!merge_domain_config);
                assert!(!strict_envoy);
            }
            None => panic!("no subcommand"),
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
