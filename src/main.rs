//! The `sluice` binary: parse settings, load config, bind, serve until SIGTERM or Ctrl-C; or
//! run one of the command-line tools (`check-config`, `explain`, `probe`: `sluice::cli`) with
//! what they need from the settings.
//! Exit codes: 0 after a clean shutdown, 64 for bad settings or config, 1 for a runtime
//! failure such as a port already in use; `check-config` exits 1 when the config is invalid
//! (or, with `--strict-envoy`, uses Sluice's YAML extensions; with `--rlqs`, has limits no
//! quota bucket can reach), `explain` and `probe` 1 when they fail.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::error::ErrorKind;
use sluice::app::{App, GrpcListener, Listeners, Reload, Xds};
use sluice::cli::check::{self, Checks};
use sluice::cli::explain::{self, Against, Offline, Requested};
use sluice::cli::probe;
use sluice::clock::SystemClock;
use sluice::config::{ConfigHandle, Poller};
use sluice::settings::{self, Command, ServeArgs, Settings};
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
            rlqs,
        }) => {
            // The same size caps as the service, so a config that passes here loads there.
            let checks = cli.serve.config_files.validate().and_then(|limits| {
                let order = settings::rlqs::key_order(&cli.serve.rlqs.rlqs_key_order)?;
                Ok((limits, rlqs.then_some(order)))
            });
            match checks {
                Ok((limits, rlqs)) => {
                    let checks = Checks {
                        merge_domain_config,
                        strict_envoy,
                        rlqs,
                    };
                    check::run(path, &checks, &limits)
                }
                Err(e) => usage_error(e),
            }
        }
        Some(Command::Probe { address }) => probe::run(&address),
        Some(Command::Explain {
            config,
            debug_address,
            domain,
            descriptor,
            hits_addend,
            request,
            json,
        }) => {
            let requested = match request {
                Some(path) => Requested::File(path),
                None => Requested::Flags {
                    domain: domain.unwrap_or_default(),
                    descriptors: descriptor,
                    hits_addend,
                },
            };
            let against = match (debug_address, config) {
                (Some(addr), _) => Against::Running(addr),
                (None, Some(path)) => Against::Config(path, offline(cli.serve)),
                // The flags require one of the two.
                (None, None) => {
                    return usage_error("give --config PATH or --debug-address HOST:PORT");
                }
            };
            explain::run(requested, against, json)
        }
        None => serve(cli.serve),
    }
}

/// What `sluice explain --config` takes from the serve settings: the config's caps and load
/// options, the request cap, the service's options (CACHE_KEY_PREFIX among them).
fn offline(serve: ServeArgs) -> Result<Box<Offline>, String> {
    let settings = serve.validate().map_err(|e| e.to_string())?;
    Ok(Box::new(Offline {
        load: settings.config.load,
        files: settings.config.files,
        max_request_bytes: settings.app.max_request_bytes,
        service: settings.app.service,
    }))
}

fn serve(args: ServeArgs) -> ExitCode {
    let mut settings = match args.validate() {
        Ok(s) => s,
        Err(e) => return usage_error(e),
    };
    // Colour only when a person reads stderr on a terminal, and NO_COLOR (no-color.org) is unset.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    sluice::telemetry::init_logs(settings.log_level, settings.log_format, colour);
    check_descriptor_limit(&settings);
    // Config is loaded and validated before any port is bound; so are the gRPC listener's
    // certificate, key and client CA, and the peers'.
    let config = match load_config(&mut settings) {
        Ok(config) => config,
        Err(code) => return code,
    };
    if let Err(e) = load_tls(&mut settings) {
        return usage_error(e);
    }
    run(settings, config)
}

fn usage_error(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("sluice: {e}");
    ExitCode::from(EXIT_USAGE)
}

/// Loads the config files and sets the app's watcher on them; with CONFIG_TYPE=GRPC_XDS_SOTW
/// there are no files: Sluice starts without config, as FORCE_START_WITHOUT_INITIAL_CONFIG
/// does, and serves what the xDS server pushes. Errors are printed.
fn load_config(settings: &mut Settings) -> Result<ConfigHandle, ExitCode> {
    let cfg = &settings.config;
    let initial = match &cfg.xds {
        Some(xds) => {
            let tls = xds.tls.as_ref().map(ClientTls::load).transpose();
            settings.app.xds = Some(Xds {
                settings: xds.clone(),
                options: cfg.load,
                tls: tls.map_err(usage_error)?,
            });
            None
        }
        None => {
            // Waits for files being written as Sluice starts to settle (the settle period at
            // most, unless they keep changing); the watcher carries on from what this saw.
            let mut poller = Poller::new(cfg.source.clone(), cfg.load, cfg.files);
            let initial = match poller.load_settled(cfg.poll_interval) {
                Ok(loaded) => Some(loaded),
                Err(errors) if cfg.force_start => {
                    for e in &errors.0 {
                        tracing::error!(error = %e, "initial config rejected; starting without config (FORCE_START_WITHOUT_INITIAL_CONFIG)");
                    }
                    None
                }
                Err(errors) => {
                    for e in &errors.0 {
                        eprintln!("sluice: {e}");
                    }
                    return Err(ExitCode::from(EXIT_USAGE));
                }
            };
            settings.app.reload = Some(Reload {
                poller,
                poll: cfg.poll_interval,
            });
            initial
        }
    };
    let loaded = initial.is_some();
    let runtime = &settings.app.runtime_limits;
    let config = ConfigHandle::with_max_runtime_limits(initial, runtime.max);
    if let Some(path) = &runtime.path {
        match config.change(|state| sluice::config::runtime::file::load(path, state)) {
            Ok(loaded) => {
                if let Some(line) = &loaded.torn {
                    tracing::warn!(line = %line, "the runtime limits journal's last line was cut short (a crash while it was written, so never answered as saved): dropped");
                }
                tracing::info!(limits = loaded.limits, journaled = loaded.journaled, path = %path.display(), "runtime limits loaded");
            }
            Err(e) => {
                return Err(usage_error(format_args!("SLUICE_RUNTIME_LIMITS_PATH: {e}")));
            }
        }
    }
    if loaded {
        // The Go service counts its start-up load as a config load.
        config
            .stats()
            .load_success
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(config)
}

/// Reads and checks the gRPC listener's and the peers' TLS files.
fn load_tls(settings: &mut Settings) -> Result<(), sluice::tls::TlsError> {
    settings.app.grpc_tls = settings
        .grpc_tls
        .as_ref()
        .map(ServerTls::load)
        .transpose()?;
    settings.app.peer_tls = settings.peer_tls.as_ref().map(PeerTls::load).transpose()?;
    Ok(())
}

/// Starts the runtime, binds the listeners and serves until a stop signal.
fn run(settings: Settings, config: ConfigHandle) -> ExitCode {
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
    let uds_bound = Arc::new(AtomicBool::new(false));
    let (grpc_uds, bound) = (settings.addrs.grpc_uds.clone(), uds_bound.clone());
    let result = runtime.block_on(async move {
        let listeners = bind_listeners(&settings, &bound).await?;
        let xds = settings.app.xds.is_some();
        // Logged once the app is built, so a backend that cannot start is not announced.
        let app = App::new(settings.app.clone(), config.clone(), Arc::new(SystemClock))
            .await
            .map_err(|e| e.to_string())?;
        log_serving(&settings, &config, &listeners);
        let (shutdown, force) = stop_signals();
        reload_on_sighup(app.reload_trigger(), xds);
        app.serve_until(listeners, shutdown, force)
            .await
            .map_err(|e| e.to_string())
    });
    if let Some(path) = grpc_uds.filter(|_| uds_bound.load(Ordering::SeqCst)) {
        // Ours, and nobody can connect to it any more.
        let _ = std::fs::remove_file(path);
    }
    match result {
        Ok(()) => {
            tracing::warn!("sluice stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sluice: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What Sluice serves, where, and from which config and store: at WARN, the default level, as
/// the Go service logs its `Listening for ... on ...` lines, so a start is never silent.
fn log_serving(settings: &Settings, config: &ConfigHandle, listeners: &Listeners) {
    let a = &settings.addrs;
    let bound =
        |l: &tokio::net::TcpListener| l.local_addr().map(|a| a.to_string()).unwrap_or_default();
    let grpc = match &a.grpc_uds {
        Some(path) => format!("unix:{}", path.display()),
        None => a.grpc.to_string(),
    };
    let (domains, limits) = config
        .current()
        .map_or((0, 0), |c| (c.domain_count(), c.limit_count()));
    let store = match (&settings.app.backend, &settings.app.cluster) {
        (sluice::app::Backend::Redis(_), _) => "redis",
        (sluice::app::Backend::Memcache(_), _) => "memcache",
        (sluice::app::Backend::Memory, Some(_)) => "memory, peer cluster",
        (sluice::app::Backend::Memory, None) => "memory",
    };
    tracing::warn!(
        http = %bound(&listeners.http),
        grpc = %grpc,
        grpc_tls = settings.app.grpc_tls.is_some(),
        debug = %bound(&listeners.debug),
        // Fields for the listeners that are off are left out.
        peer = listeners.peer.as_ref().map(|l| display(bound(l))),
        prometheus = listeners.prometheus.as_ref().map(|l| display(bound(l))),
        spoa = listeners.spoa.as_ref().map(|l| display(bound(l))),
        config = ?settings.config.source,
        domains,
        limits,
        store,
        "sluice listening"
    );
}

/// Binds every listener the settings ask for; `uds_bound` is set once GRPC_UDS is.
async fn bind_listeners(settings: &Settings, uds_bound: &AtomicBool) -> Result<Listeners, String> {
    let bind = |addr, what: &'static str| async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot bind the {what} listener on {addr}: {e}"))
    };
    let a = &settings.addrs;
    Ok(Listeners {
        http: bind(a.http, "HTTP (PORT)").await?,
        grpc: match &a.grpc_uds {
            Some(path) => {
                let listener = bind_unix(path)?;
                uds_bound.store(true, Ordering::SeqCst);
                GrpcListener::Unix(listener)
            }
            None => bind(a.grpc, "gRPC (GRPC_PORT)").await?.into(),
        },
        debug: bind(a.debug, "debug (DEBUG_PORT)").await?,
        peer: match &settings.app.cluster {
            Some(c) => Some(bind(c.listen, "peer (PEER_PORT)").await?),
            None => None,
        },
        prometheus: match a.prometheus {
            Some(addr) => Some(bind(addr, "Prometheus (PROMETHEUS_ADDR)").await?),
            None => None,
        },
        spoa: match a.spoa {
            Some(addr) => Some(bind(addr, "HAProxy SPOE agent (SPOA_PORT)").await?),
            None => None,
        },
    })
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
        + u64::from(settings.app.cluster.is_some())
        + u64::from(settings.addrs.prometheus.is_some())
        + u64::from(settings.addrs.spoa.is_some());
    let allowed = listeners.saturating_mul(settings.app.listener_limits.max_connections as u64);
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
            let signal = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            count_tx.send_modify(|n| *n = n.saturating_add(1));
            if *count_tx.borrow() == 1 {
                tracing::warn!(
                    signal,
                    "sluice stopping: health fails now, then the listeners drain (a second signal stops at once)"
                );
            } else {
                tracing::warn!(signal, "sluice stopping at once: second signal");
            }
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
