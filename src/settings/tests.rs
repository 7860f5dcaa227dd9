//! The shared test helpers (`parse`, `serve`, `settings`, `error`) the subsystem files use, and
//! the settings `ServeArgs::validate` composes: listeners, headers, limits, the CLI parser.

use clap::CommandFactory;
use clap::error::ErrorKind;

use super::cli::{ignore_empty_env, parse_with};
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
    assert!(error(&["--sweep-interval-secs", "0"]).starts_with("SLUICE_SWEEP_INTERVAL_SECS=0:"));
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
