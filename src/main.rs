//! The `sluice` binary: parse settings, load config, bind, serve until SIGTERM or Ctrl-C.
//! Exit codes: 0 after a clean shutdown, 64 for bad settings or config, 1 for a runtime
//! failure such as a port already in use; `check-config` exits 1 when the config is invalid (or, with `--strict-envoy`, uses
//! Sluice's YAML extensions).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::error::ErrorKind;
use sluice::app::{App, AppOptions, GrpcListener, Listeners, Reload, Xds};
use sluice::clock::SystemClock;
use sluice::config::{self, ConfigHandle, ConfigSource, FileLimits, LoadOptions, Poller};
use sluice::service::{HeaderNames, ServiceOptions};
use sluice::settings::{self, Command, ConfigLocation, ServeArgs, Settings};
use sluice::tls::{ClientTls, PeerTls, ServerTls};

const EXIT_USAGE: u8 = 64;

fn main() -> ExitCode {
    let cli = match settings::parse_cli() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => ExitCode::SUCCESS,
                _ => ExitCode::from(EXIT_USAGE),
            };
        }
    };
    match cli.command {
        Some(Command::CheckConfig {
            path,
            merge_domain_config,
            strict_envoy,
        }) => match cli.serve.config_files.validate() {
            // The same size caps as the service, so a config that passes here loads there.
            Ok(limits) => check_config(path, merge_domain_config, strict_envoy, &limits),
            Err(e) => {
                eprintln!("sluice: {e}");
                ExitCode::from(EXIT_USAGE)
            }
        },
        None => serve(cli.serve),
    }
}

/// Validates a config; with `strict_envoy`, every use of a Sluice YAML extension is a failure
/// too. Problems go to stderr, one per line; the OK line only when there are none.
fn check_config(
    path: PathBuf,
    merge_domain_config: bool,
    strict_envoy: bool,
    limits: &FileLimits,
) -> ExitCode {
    let source = ConfigSource::Path(path.clone());
    let loaded = config::load(
        &source,
        &LoadOptions {
            merge_domain_config,
        },
        limits,
    );
    let mut failed = false;
    if let Err(errors) = &loaded {
        failed = true;
        for e in &errors.0 {
            eprintln!("{e}");
        }
    }
    if strict_envoy {
        match config::envoy_extensions(&source, limits) {
            Ok(uses) => {
                failed |= !uses.is_empty();
                for u in &uses {
                    eprintln!("{u}");
                }
            }
            // Unreadable files were just reported by the load, unless they changed since.
            Err(errors) if loaded.is_ok() => {
                failed = true;
                for e in &errors.0 {
                    eprintln!("{e}");
                }
            }
            Err(_) => {}
        }
    }
    match loaded {
        Ok(cfg) if !failed => {
            println!("{}: OK ({} domains)", path.display(), cfg.domain_count());
            ExitCode::SUCCESS
        }
        _ => ExitCode::FAILURE,
    }
}

fn config_source(location: &ConfigLocation) -> ConfigSource {
    match location {
        ConfigLocation::Path(p) => ConfigSource::Path(p.clone()),
        ConfigLocation::Runtime {
            root,
            subdirectory,
            app_directory,
        } => ConfigSource::Runtime {
            root: root.clone(),
            subdirectory: subdirectory.clone(),
            app_directory: app_directory.clone(),
        },
    }
}

/// Where config updates come from: polled files or an xDS stream.
enum ConfigFeed {
    /// Boxed: the poller is large, and this is built once.
    Files(Box<Reload>),
    /// Boxed: the xDS settings are large, and this is built once.
    Xds(Box<Xds>),
}

fn app_options(
    s: &Settings,
    feed: ConfigFeed,
    grpc_tls: Option<ServerTls>,
    peer_tls: Option<PeerTls>,
) -> AppOptions {
    let (reload, xds) = match feed {
        ConfigFeed::Files(reload) => (Some(*reload), None),
        ConfigFeed::Xds(xds) => (None, Some(*xds)),
    };
    AppOptions {
        service: ServiceOptions {
            shadow_mode: s.shadow_mode,
            quota_mode: s.quota_mode,
            response_headers: s.response_headers.as_ref().map(|h| HeaderNames {
                limit: h.limit.clone(),
                remaining: h.remaining.clone(),
                reset: h.reset.clone(),
            }),
            cache_key_prefix: s.cache_key_prefix.clone(),
            dynamic_metadata: s.response_dynamic_metadata,
            fail_open: s.fail_open,
            fail_open_domains: s.fail_open_domains.clone(),
            max_descriptors: s.max_descriptors.get(),
            max_entries: s.max_entries.get(),
            max_key_bytes: s.caps.max_key_bytes.get(),
        },
        max_counters: s.max_counters.get(),
        max_counter_bytes: s.caps.max_counter_bytes.get(),
        sweep_interval: s.sweep_interval,
        max_request_bytes: s.max_request_bytes.get(),
        require_config_for_health: s.healthy_with_at_least_one_config_loaded,
        shutdown_delay: s.shutdown_delay,
        drain_timeout: s.drain_timeout,
        reload,
        backend: s.backend.clone(),
        cluster: s.cluster.clone(),
        xds,
        telemetry: sluice::telemetry::TelemetryOptions {
            stats: s.telemetry.stats,
            prometheus_path: s.telemetry.prometheus_path.clone(),
            statsd: s.telemetry.statsd,
            tracing: s.telemetry.tracing.clone(),
            otlp_metrics: s.telemetry.otlp_metrics.clone(),
        },
        grpc_tls,
        grpc_connection_age: s.grpc_connection_age,
        listener_limits: s.listener_limits.clone(),
        peer_tls,
    }
}

fn serve(args: ServeArgs) -> ExitCode {
    let settings = match args.validate() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sluice: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    sluice::telemetry::init_logs(settings.log_level, settings.log_format);
    check_descriptor_limit(&settings);

    // Config is loaded and validated before any port is bound. With CONFIG_TYPE=GRPC_XDS_SOTW
    // there are no files: Sluice starts without config, as FORCE_START_WITHOUT_INITIAL_CONFIG
    // does, and serves what the xDS server pushes.
    let source = config_source(&settings.config);
    let load_options = LoadOptions {
        merge_domain_config: settings.merge_domain_config,
    };
    let (initial, config_feed) = match &settings.xds {
        Some(xds) => (
            None,
            ConfigFeed::Xds(Box::new(Xds {
                settings: xds.clone(),
                options: load_options,
                tls: match xds.tls.as_ref().map(ClientTls::load).transpose() {
                    Ok(tls) => tls,
                    Err(e) => {
                        eprintln!("sluice: {e}");
                        return ExitCode::from(EXIT_USAGE);
                    }
                },
            })),
        ),
        None => {
            // Waits for files being written as Sluice starts to settle (the settle period at
            // most, unless they keep changing); the watcher carries on from what this saw.
            let mut poller = Poller::new(source, load_options, settings.config_files);
            let initial = match poller.load_settled(settings.config_poll_interval) {
                Ok(cfg) => Some(cfg),
                Err(errors) if settings.force_start_without_initial_config => {
                    for e in &errors.0 {
                        tracing::error!(error = %e, "initial config rejected; starting without config (FORCE_START_WITHOUT_INITIAL_CONFIG)");
                    }
                    None
                }
                Err(errors) => {
                    for e in &errors.0 {
                        eprintln!("sluice: {e}");
                    }
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            let reload = Reload {
                poller,
                poll: settings.config_poll_interval,
            };
            (initial, ConfigFeed::Files(Box::new(reload)))
        }
    };
    let loaded = initial.is_some();
    let config = ConfigHandle::new(initial);
    if loaded {
        // The Go service counts its start-up load as a config load.
        config
            .stats()
            .load_success
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    // The gRPC listener's certificate, key and client CA, and the peers', are read and checked
    // before any port is bound, like the config.
    let grpc_tls = match settings.grpc_tls.as_ref().map(ServerTls::load).transpose() {
        Ok(tls) => tls,
        Err(e) => {
            eprintln!("sluice: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let peer_tls = match settings.peer_tls.as_ref().map(PeerTls::load).transpose() {
        Ok(tls) => tls,
        Err(e) => {
            eprintln!("sluice: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let options = app_options(&settings, config_feed, grpc_tls, peer_tls);

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sluice: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Set once GRPC_UDS is bound: only then is the socket file ours to remove.
    let uds_bound = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (grpc_uds, bound) = (settings.grpc_uds.clone(), uds_bound.clone());
    let result = runtime.block_on(async move {
        let bind = |addr, what: &'static str| async move {
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot bind the {what} listener on {addr}: {e}"))
        };
        let listeners = Listeners {
            http: bind(settings.http_addr, "HTTP (PORT)").await?,
            grpc: match &settings.grpc_uds {
                Some(path) => {
                    let listener = bind_unix(path)?;
                    bound.store(true, std::sync::atomic::Ordering::SeqCst);
                    GrpcListener::Unix(listener)
                }
                None => bind(settings.grpc_addr, "gRPC (GRPC_PORT)").await?.into(),
            },
            debug: bind(settings.debug_addr, "debug (DEBUG_PORT)").await?,
            peer: match &settings.cluster {
                Some(c) => Some(bind(c.listen, "peer (PEER_PORT)").await?),
                None => None,
            },
            prometheus: match settings.telemetry.prometheus_addr {
                Some(addr) => Some(bind(addr, "Prometheus (PROMETHEUS_ADDR)").await?),
                None => None,
            },
        };
        tracing::info!(
            http = %settings.http_addr,
            grpc = %settings.grpc_addr,
            grpc_uds = ?settings.grpc_uds,
            grpc_tls = settings.grpc_tls.is_some(),
            peer_tls = settings.peer_tls.is_some(),
            debug = %settings.debug_addr,
            "serving"
        );
        let app = App::new(options, config, Arc::new(SystemClock)).map_err(|e| e.to_string())?;
        let (shutdown, force) = stop_signals();
        reload_on_sighup(app.reload_trigger(), settings.xds.is_some());
        app.serve_until(listeners, shutdown, force)
            .await
            .map_err(|e| e.to_string())
    });
    if let Some(path) = grpc_uds.filter(|_| uds_bound.load(std::sync::atomic::Ordering::SeqCst)) {
        // Ours, and nobody can connect to it any more.
        let _ = std::fs::remove_file(path);
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Binds GRPC_UDS. A socket file left by a process that is gone (nothing accepts on it) is
/// replaced; one something still listens on, and any other kind of file, is left alone.
fn bind_unix(path: &std::path::Path) -> Result<tokio::net::UnixListener, String> {
    use std::os::unix::fs::FileTypeExt;
    let shown = path.display();
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(format!(
                "GRPC_UDS={shown}: the file exists and is not a socket; not replacing it"
            ));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(format!(
                "GRPC_UDS={shown}: another process is serving on this socket"
            ));
        }
        std::fs::remove_file(path)
            .map_err(|e| format!("GRPC_UDS={shown}: cannot remove the stale socket: {e}"))?;
    }
    tokio::net::UnixListener::bind(path)
        .map_err(|e| format!("cannot bind the gRPC listener on GRPC_UDS={shown}: {e}"))
}

/// Raises the descriptor limit, and warns when it is still below what the connection caps
/// allow: accept then fails (and backs off) before the caps are reached.
fn check_descriptor_limit(settings: &Settings) {
    let Some(limit) = sluice::net::raise_descriptor_limit() else {
        return;
    };
    let listeners = 3
        + u64::from(settings.cluster.is_some())
        + u64::from(settings.telemetry.prometheus_addr.is_some());
    let allowed = listeners.saturating_mul(settings.listener_limits.max_connections as u64);
    if limit < allowed {
        tracing::warn!(
            descriptor_limit = limit,
            connections_allowed = allowed,
            "the open-file limit is below SLUICE_MAX_CONNECTIONS times the listeners; connections \
             past it are refused by the kernel's backlog instead (raise `ulimit -n` or lower the cap)"
        );
    }
}

/// SIGHUP: load the config files now, without waiting for a change to settle (the operator
/// says they are complete); nothing to do when the config comes from xDS. Without a handler,
/// SIGHUP would end the process. Must be called inside the runtime.
fn reload_on_sighup(trigger: Arc<tokio::sync::Notify>, xds: bool) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(hup) => hup,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP");
            return;
        }
    };
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            if xds {
                tracing::info!("SIGHUP: the config comes from xDS; nothing to reload");
            } else {
                tracing::info!("SIGHUP: loading the config files now");
                trigger.notify_one();
            }
        }
    });
}

/// The stop signals, SIGTERM and Ctrl-C (SIGINT): the first completes the first future and
/// starts the graceful shutdown; a second completes the other, which ends the drain at once.
/// Must be called inside the runtime.
fn stop_signals() -> (
    impl std::future::Future<Output = ()>,
    impl std::future::Future<Output = ()>,
) {
    let (count_tx, count) = tokio::sync::watch::channel(0u8);
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (mut term, mut int) = match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(term), Ok(int)) => (term, int),
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM or SIGINT; only SIGKILL stops sluice");
                return std::future::pending().await;
            }
        };
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            count_tx.send_modify(|n| *n = n.saturating_add(1));
        }
    });
    let nth = |n: u8| {
        let mut count = count.clone();
        async move {
            // The sender lives as long as the runtime.
            let _ = count.wait_for(|c| *c >= n).await;
        }
    };
    (nth(1), nth(2))
}
