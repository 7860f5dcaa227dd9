//! Wiring only: builds the store, the service and the three listeners' servers, and runs them
//! until shutdown. Listeners are passed in already bound, so tests bind port 0.

use std::future::{Future, IntoFuture};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::server::TcpIncoming;

use crate::api;
use crate::api::health::Health;
use crate::clock::Clock;
use crate::cluster::ClusterStore;
use crate::cluster::peer::PeerServer;
use crate::config::{ConfigHandle, LoadOptions, Poller};
use crate::service::{RateLimitService, ServiceOptions};
use crate::settings::{Backend, ClusterSettings, GrpcConnectionAge, XdsSettings};
use crate::store::{AnyStore, MemoryStore, RedisStore, StoreError};
use crate::telemetry::otlp::Tracer;
use crate::telemetry::otlp::trace::SpanRecord;
use crate::telemetry::{Stats, TelemetryOptions};
use crate::tls::{ClientTls, ServerTls};

/// The bound listeners.
pub struct Listeners {
    pub http: TcpListener,
    pub grpc: GrpcListener,
    pub debug: TcpListener,
    /// PEER_PORT, when peers are configured.
    pub peer: Option<TcpListener>,
    /// USE_PROMETHEUS's PROMETHEUS_ADDR: `/metrics` (PROMETHEUS_PATH) on its own port.
    pub prometheus: Option<TcpListener>,
}

impl Listeners {
    /// Binds all three on 127.0.0.1 with OS-chosen ports (for tests).
    pub async fn ephemeral() -> std::io::Result<Self> {
        Ok(Listeners {
            http: TcpListener::bind("127.0.0.1:0").await?,
            grpc: TcpListener::bind("127.0.0.1:0").await?.into(),
            debug: TcpListener::bind("127.0.0.1:0").await?,
            peer: None,
            prometheus: None,
        })
    }
}

/// The gRPC listener: GRPC_HOST:GRPC_PORT, or GRPC_UDS's unix socket.
pub enum GrpcListener {
    Tcp(TcpListener),
    Unix(tokio::net::UnixListener),
}

impl From<TcpListener> for GrpcListener {
    fn from(listener: TcpListener) -> Self {
        GrpcListener::Tcp(listener)
    }
}

impl GrpcListener {
    /// The TCP address; an error for a unix socket.
    pub fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        match self {
            GrpcListener::Tcp(l) => l.local_addr(),
            GrpcListener::Unix(_) => Err(std::io::Error::other("gRPC is on a unix socket")),
        }
    }
}

/// Where to watch for config changes: the poller that loaded the start-up config (or a new
/// one), run every `poll`.
#[derive(Clone, Debug)]
pub struct Reload {
    pub poller: Poller,
    pub poll: Duration,
}

/// The xDS config source (CONFIG_TYPE=GRPC_XDS_SOTW), used instead of [`Reload`].
#[derive(Clone, Debug)]
pub struct Xds {
    pub settings: XdsSettings,
    /// MERGE_DOMAIN_CONFIG applies to resources as it does to files.
    pub options: LoadOptions,
    /// `settings.tls`, with its files read and checked.
    pub tls: Option<ClientTls>,
}

/// Everything [`App`] needs that is not a listener or a loaded config.
#[derive(Clone, Debug)]
pub struct AppOptions {
    pub service: ServiceOptions,
    pub max_counters: usize,
    pub sweep_interval: Duration,
    pub max_request_bytes: usize,
    /// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED.
    pub require_config_for_health: bool,
    /// How long health reports failing after SIGTERM before the listeners stop accepting.
    pub shutdown_delay: Duration,
    /// How long in-flight calls get to finish once the listeners stop.
    pub drain_timeout: Duration,
    pub reload: Option<Reload>,
    pub backend: Backend,
    /// PEERS / PEERS_DNS.
    pub cluster: Option<ClusterSettings>,
    /// Config streamed from an xDS server; the app starts without config (or with whatever
    /// the handle holds) and serves each accepted update.
    pub xds: Option<Xds>,
    pub telemetry: TelemetryOptions,
    /// GRPC_SERVER_USE_TLS: the gRPC listener speaks TLS, with this certificate (re-read from
    /// its files every [`CERT_POLL`]).
    pub grpc_tls: Option<ServerTls>,
    /// GRPC_MAX_CONNECTION_AGE and _GRACE.
    pub grpc_connection_age: GrpcConnectionAge,
}

/// How often the gRPC listener's certificate files are checked for changes. Kubernetes
/// updates a mounted secret within a minute or so; a second more does not matter.
pub const CERT_POLL: Duration = Duration::from_secs(1);

/// A built, not yet serving, Sluice.
pub struct App {
    options: AppOptions,
    config: ConfigHandle,
    store: Arc<AnyStore>,
    service: Arc<RateLimitService<AnyStore>>,
    health: Arc<Health>,
    peer_server: Option<PeerServer>,
    /// TRACING_ENABLED: the finished spans, for the exporter [`App::serve`] starts.
    spans: Option<tokio::sync::mpsc::Receiver<SpanRecord>>,
}

impl App {
    /// Must be called inside a tokio runtime (the store's background tasks are spawned).
    pub fn new(
        options: AppOptions,
        config: ConfigHandle,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StoreError> {
        let memory = || {
            MemoryStore::with_sweeper(options.max_counters, clock.clone(), options.sweep_interval)
        };
        let mut peer_server = None;
        let store = Arc::new(match (&options.backend, &options.cluster) {
            (Backend::Redis(redis), _) => AnyStore::Redis(RedisStore::start(redis)?),
            (Backend::Memory, None) => AnyStore::Memory(memory()),
            (Backend::Memory, Some(cluster)) => {
                let store = ClusterStore::start(Arc::new(memory()), cluster, clock.clone())
                    .map_err(|message| StoreError::Backend { message })?;
                peer_server = Some(PeerServer::new(store.owner().clone(), clock.clone()));
                AnyStore::Cluster(store)
            }
        });
        let stats = Arc::new(Stats::new(options.telemetry.stats));
        let (tracer, spans) = match &options.telemetry.tracing {
            Some(t) => {
                let (tracer, rx) = Tracer::new(t.sampling_rate, t.max_queue_size);
                (tracer, Some(rx))
            }
            None => (Tracer::disabled(), None),
        };
        let service = Arc::new(
            RateLimitService::new(
                config.clone(),
                store.clone(),
                clock,
                options.service.clone(),
            )
            .with_stats(stats)
            .with_tracer(Arc::new(tracer)),
        );
        let ready = store.clone();
        let health = Arc::new(Health::new(
            config.clone(),
            options.require_config_for_health,
            Arc::new(move || ready.is_ready()),
        ));
        Ok(App {
            options,
            config,
            store,
            service,
            health,
            peer_server,
            spans,
        })
    }

    pub fn service(&self) -> &Arc<RateLimitService<AnyStore>> {
        &self.service
    }

    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// Serves until `shutdown` completes, then: health fails, `shutdown_delay` passes (so load
    /// balancers see the failing health check), the listeners stop accepting, and in-flight
    /// calls get up to `drain_timeout` to finish.
    pub async fn serve(
        self,
        listeners: Listeners,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        let App {
            mut options,
            config,
            store,
            service,
            health,
            peer_server,
            spans,
        } = self;
        // Taken, not cloned: the poller holds the bytes of the files it last loaded.
        let _watcher = options
            .reload
            .take()
            .map(|r| crate::config::spawn_watcher(r.poller, config.clone(), r.poll));
        let _xds = options.xds.as_ref().map(|x| {
            crate::xds::spawn(x.settings.clone(), x.tls.clone(), x.options, config.clone())
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        let stopped = move || {
            let mut rx = stop_rx.clone();
            async move {
                // Err means the sender is gone, which also means stop.
                let _ = rx.wait_for(|stop| *stop).await;
            }
        };

        let (grpc_routes, health_updater) =
            api::grpc::routes(service.clone(), health.clone(), options.max_request_bytes);
        let mut grpc_builder = tonic::transport::Server::builder();
        if let Some(age) = options.grpc_connection_age.max_age {
            // Clients reconnect, so long-lived connections get spread again over replicas
            // added since, as envoyproxy/ratelimit does (without grpc-go's ±10 % jitter).
            // The grace is not handed to tonic: tonic 0.14 then skips the GOAWAY at `age` and
            // only cuts the connection at `age + grace`. Without it, in-flight calls finish
            // after the GOAWAY and the connection closes; Sluice's calls are bounded by
            // REDIS_TIMEOUT and SLUICE_PEER_TIMEOUT_MS, far below any sensible grace.
            grpc_builder = grpc_builder.max_connection_age(age);
        }
        let grpc_server = grpc_builder.add_routes(grpc_routes);
        // Both guards live until `serve` returns: the certificate watcher and the TLS accept
        // loop (which also stops by itself once the gRPC server drops its incoming stream).
        let mut _grpc_tls_tasks = None;
        let grpc = match (listeners.grpc, &options.grpc_tls) {
            // GRPC_UDS with TLS is refused by the settings.
            (GrpcListener::Unix(listener), _) => {
                let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
                tokio::spawn(grpc_server.serve_with_incoming_shutdown(incoming, stopped()))
            }
            (GrpcListener::Tcp(listener), None) => {
                // tonic ignores its own `tcp_nodelay` default for an incoming stream it did not
                // bind, so set TCP_NODELAY here: with Nagle's algorithm on, a response's
                // trailers wait for the client's delayed ACK (up to 40 ms) whenever the
                // previous write is unacknowledged.
                let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
                tokio::spawn(grpc_server.serve_with_incoming_shutdown(incoming, stopped()))
            }
            (GrpcListener::Tcp(listener), Some(tls)) => {
                let watcher = tls.watch(CERT_POLL);
                let (incoming, accept_loop) = crate::tls::incoming(listener, tls.acceptor());
                _grpc_tls_tasks = Some((watcher, accept_loop));
                tokio::spawn(grpc_server.serve_with_incoming_shutdown(incoming, stopped()))
            }
        };
        let http_router =
            api::http::router(service.clone(), health.clone(), options.max_request_bytes);
        let http = tokio::spawn(
            axum::serve(listeners.http, http_router)
                .with_graceful_shutdown(stopped())
                .into_future(),
        );
        let stats = service.stats().clone();
        let span_counters = service.tracer().counters().clone();
        // What /metrics, /stats, statsd and OTLP metrics all read.
        let debug_state = api::debug::DebugState {
            config: config.clone(),
            store: store.clone(),
            stats: stats.clone(),
            spans: service.tracer().enabled().then(|| span_counters.clone()),
        };
        let prometheus = listeners.prometheus.map(|listener| {
            let router =
                api::debug::metrics_router(&options.telemetry.prometheus_path, debug_state.clone());
            tokio::spawn(
                axum::serve(listener, router)
                    .with_graceful_shutdown(stopped())
                    .into_future(),
            )
        });
        let statsd = options.telemetry.statsd.map(|(addr, interval)| {
            let (state, stats) = (debug_state.clone(), stats.clone());
            tokio::spawn(async move {
                let mut sink = match crate::telemetry::statsd::StatsdSink::connect(addr).await {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::error!(%addr, error = %e, "statsd disabled: cannot open a UDP socket");
                        return;
                    }
                };
                let mut ticker = tokio::time::interval(interval);
                ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let failures = crate::telemetry::LogLimiter::new(Duration::from_secs(60));
                loop {
                    ticker.tick().await;
                    let extra = state.extra();
                    if let Err(e) = sink.flush(&stats, &extra).await
                        && let Some(suppressed) = failures.check()
                    {
                        tracing::warn!(%addr, error = %e, suppressed, "statsd flush failed");
                    }
                }
            })
        });
        // The OTLP exporters stop after the drain, so the last calls' spans are sent too.
        let (otlp_stop_tx, otlp_stop_rx) = watch::channel(false);
        let otlp_stopped = move || {
            let mut rx = otlp_stop_rx.clone();
            async move {
                let _ = rx.wait_for(|stop| *stop).await;
            }
        };
        let span_exporter = match (&options.telemetry.tracing, spans) {
            (Some(t), Some(rx)) => Some(tokio::spawn(
                crate::telemetry::otlp::export::run_span_exporter(
                    t.clone(),
                    rx,
                    span_counters.clone(),
                    otlp_stopped(),
                ),
            )),
            _ => None,
        };
        let metrics_exporter = options.telemetry.otlp_metrics.as_ref().map(|m| {
            let state = debug_state.clone();
            tokio::spawn(crate::telemetry::otlp::export::run_metrics_exporter(
                m.clone(),
                stats.clone(),
                move || state.extra(),
                otlp_stopped(),
            ))
        });
        let debug_router = api::debug::router(debug_state);
        let debug = tokio::spawn(
            axum::serve(listeners.debug, debug_router)
                .with_graceful_shutdown(stopped())
                .into_future(),
        );

        let peer = match (peer_server, listeners.peer) {
            (Some(server), Some(listener)) => Some(tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(server)
                    .serve_with_incoming_shutdown(
                        TcpIncoming::from(listener).with_nodelay(Some(true)),
                        stopped(),
                    ),
            )),
            _ => None,
        };

        let gave_up = store.gave_up();
        let failure = tokio::select! {
            () = shutdown => None,
            reason = gave_up => Some(reason),
        };
        tracing::info!("shutting down: health now failing");
        health.fail_sigterm();
        if failure.is_none() {
            tokio::time::sleep(options.shutdown_delay).await;
        }
        let _ = stop_tx.send(true);
        let drained = tokio::time::timeout(options.drain_timeout, async {
            let (g, h, d) = tokio::join!(grpc, http, debug);
            (g, h, d)
        })
        .await;
        health_updater.abort();
        if let Some(p) = peer {
            p.abort();
        }
        if let Some(p) = prometheus {
            p.abort();
        }
        if let Some(s) = statsd {
            s.abort();
        }
        // A last export of what is queued, bounded by the export timeout (plus a margin).
        let _ = otlp_stop_tx.send(true);
        for (task, timeout) in [
            (
                span_exporter,
                options
                    .telemetry
                    .tracing
                    .as_ref()
                    .map(|t| t.endpoint.timeout),
            ),
            (
                metrics_exporter,
                options
                    .telemetry
                    .otlp_metrics
                    .as_ref()
                    .map(|m| m.endpoint.timeout),
            ),
        ] {
            if let (Some(task), Some(timeout)) = (task, timeout) {
                let abort = task.abort_handle();
                if tokio::time::timeout(timeout + Duration::from_millis(500), task)
                    .await
                    .is_err()
                {
                    abort.abort();
                }
            }
        }
        if let Some(reason) = failure {
            return Err(std::io::Error::other(reason));
        }
        match drained {
            Err(_) => {
                tracing::warn!(
                    timeout = ?options.drain_timeout,
                    "in-flight calls did not finish before the drain timeout"
                );
                Ok(())
            }
            Ok((g, h, d)) => {
                fn flatten<E: std::fmt::Display>(
                    what: &str,
                    r: Result<Result<(), E>, tokio::task::JoinError>,
                ) -> std::io::Result<()> {
                    match r {
                        Ok(Ok(())) => Ok(()),
                        Ok(Err(e)) => Err(std::io::Error::other(format!("{what} server: {e}"))),
                        Err(e) => Err(std::io::Error::other(format!("{what} server task: {e}"))),
                    }
                }
                flatten("gRPC", g)?;
                flatten("HTTP", h)?;
                flatten("debug", d)?;
                Ok(())
            }
        }
    }
}
