//! The `sluice` binary: parse settings, load config, bind, serve until SIGTERM or Ctrl-C.
//! Exit codes: 0 after a clean shutdown, 64 for bad settings or config, 1 for a runtime
//! failure such as a port already in use; `check-config` exits 1 when the config is invalid (or, with `--strict-envoy`, uses
//! Sluice's YAML extensions; with `--rlqs`, has limits no quota bucket can reach).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::error::ErrorKind;
use sluice::app::{App, GrpcListener, Listeners, Reload, Xds};
use sluice::clock::SystemClock;
use sluice::config::{self, ConfigHandle, ConfigSource, FileLimits, LoadOptions, Poller};
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
                Ok((limits, order)) => {
                    check_config(path, (merge_domain_config, strict_envoy), order, &limits)
                }
                Err(e) => {
                    eprintln!("sluice: {e}");
                    ExitCode::from(EXIT_USAGE)
                }
            }
        }
        Some(Command::Probe { address }) => match sluice::api::explain::probe(&address) {
            Ok(checked) => {
                println!("{checked}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("sluice probe: {e}");
                ExitCode::FAILURE
            }
        },
        Some(Command::Explain {
            config,
            debug_address,
            domain,
            descriptor,
            hits_addend,
            request,
            json,
        }) => {
            use sluice::api::explain::{Asked, fetch, query};
            let asked = match request {
                Some(path) => read_request(&path).map(Asked::Json),
                None => Ok(Asked::Query(query(
                    &domain.unwrap_or_default(),
                    &descriptor,
                    hits_addend,
                ))),
            };
            let answer = asked.and_then(|asked| match (config, debug_address) {
                (_, Some(addr)) => fetch(&addr, &asked),
                (Some(path), None) => explain_offline(path, &asked, cli.serve),
                (None, None) => Err("give --config PATH or --debug-address HOST:PORT".into()),
            });
            print_explained(answer, json)
        }
        None => serve(cli.serve),
    }
}

/// Prints an explanation (as JSON, or as text), or why there is none (exit 1).
fn print_explained(answer: Result<serde_json::Value, String>, json: bool) -> ExitCode {
    match answer {
        Ok(v) if json => println!("{v}"),
        Ok(v) => print!("{}", sluice::api::explain::render(&v)),
        Err(e) => {
            eprintln!("sluice explain: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// `sluice explain --request PATH`: the file's JSON (`-`: standard input), at most 8 MiB.
fn read_request(path: &std::path::Path) -> Result<String, String> {
    use std::io::Read;
    let mut text = String::new();
    let read = if path.as_os_str() == "-" {
        std::io::stdin().take(8 << 20).read_to_string(&mut text)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(8 << 20).read_to_string(&mut text))
    };
    read.map(|_| text)
        .map_err(|e| format!("--request {}: {e}", path.display()))
}

/// `sluice explain --config PATH`: the request `asked` explained against the config at `path`
/// (loaded as the service loads it, with the serve settings' key prefix and caps); no counters
/// are read.
fn explain_offline(
    path: PathBuf,
    asked: &sluice::api::explain::Asked,
    serve: ServeArgs,
) -> Result<serde_json::Value, String> {
    use sluice::store::MemoryStore;
    let settings = serve.validate().map_err(|e| e.to_string())?;
    let limits = settings.config.files;
    let source = ConfigSource::Path(path);
    let loaded = config::load(&source, &settings.config.load, &limits).map_err(|errors| {
        errors
            .0
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    })?;
    let request = sluice::api::explain::decode(asked, settings.app.max_request_bytes)?;
    let service = sluice::service::RateLimitService::new(
        ConfigHandle::new(Some(loaded)),
        Arc::new(MemoryStore::new(1)),
        Arc::new(SystemClock),
        settings.app.service,
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|e| e.to_string())?;
    runtime
        .block_on(service.explain(&request, false))
        .map_err(|e| e.to_string())
}

/// Validates a config; with `strict_envoy`, every use of a Sluice YAML extension is a failure
/// too, and with a bucket key order (`--rlqs`) every limit no quota bucket can reach. Problems
/// go to stderr, one per line; the OK line only when there are none.
fn check_config(
    path: PathBuf,
    (merge_domain_config, strict_envoy): (bool, bool),
    rlqs: Option<sluice::quota::KeyOrder>,
    limits: &FileLimits,
) -> ExitCode {
    let source = ConfigSource::Path(path.clone());
    let loaded = config::load(
        &source,
        &LoadOptions {
            merge_domain_config,
            without_slots: None,
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
    if let (Ok(cfg), Some(order)) = (&loaded, &rlqs) {
        let unreachable = sluice::quota::unreachable_by_buckets(cfg, order);
        failed |= !unreachable.is_empty();
        for u in &unreachable {
            eprintln!("{u}");
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
    let config = ConfigHandle::new(initial);
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
        .map_or((0, 0), |c| (c.domain_count(), c.limits().count()));
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
