//! Wiring only: builds the store, the service and the three listeners' servers, and runs them
//! until shutdown. Listeners are passed in already bound, so tests bind port 0.
//!
//! The composition root: [`AppOptions`] is what `crate::settings` builds (tests build it
//! directly), and `backend` picks the counter store. No module below it imports `app`.

mod backend;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

pub(crate) use backend::AnyStore;
pub use backend::Backend;

use crate::api;
use crate::api::health::Health;
use crate::clock::Clock;
use crate::cluster::ClusterConfig;
use crate::cluster::ClusterStore;
use crate::cluster::peer::PeerServer;
use crate::config::{ConfigHandle, LoadOptions, Poller};
use crate::net::{self, ByteBudget, ConnectionAge, PortGuard};
use crate::rlqs::{RlqsOptions, RlqsService};
use crate::service::{RateLimitService, ServiceOptions};
use crate::store::{MemcacheStore, MemoryLimits, MemoryStore, RedisStore, StoreError};
use crate::telemetry::otlp::Tracer;
use crate::telemetry::otlp::trace::SpanRecord;
use crate::telemetry::{DecisionTelemetry, Stats, TelemetryOptions};
use crate::tls::{ClientTls, PeerTls, ServerTls};
use crate::xds::XdsConfig;

/// The bound listeners.
pub struct Listeners {
    pub http: TcpListener,
    pub grpc: GrpcListener,
    pub debug: TcpListener,
    /// PEER_PORT, when peers are configured.
    pub peer: Option<TcpListener>,
    /// USE_PROMETHEUS's PROMETHEUS_ADDR: `/metrics` (PROMETHEUS_PATH) on its own port.
    pub prometheus: Option<TcpListener>,
    /// SPOA_PORT: HAProxy's SPOE agent, with [`AppOptions::spoa`].
    pub spoa: Option<TcpListener>,
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
            spoa: None,
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

impl From<GrpcListener> for net::Listener {
    fn from(listener: GrpcListener) -> Self {
        match listener {
            GrpcListener::Tcp(l) => net::Listener::Tcp(l),
            GrpcListener::Unix(l) => net::Listener::Unix(l),
        }
    }
}

impl GrpcListener {
    fn is_unix(&self) -> bool {
        matches!(self, GrpcListener::Unix(_))
    }

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
    pub settings: XdsConfig,
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
    /// SLUICE_MAX_COUNTER_BYTES: the memory store's byte budget.
    pub max_counter_bytes: usize,
    /// SLUICE_DEBUG_COUNTER_RESET: whether `/debug/counters/reset` may reset counters.
    pub counter_reset: bool,
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
    pub cluster: Option<ClusterConfig>,
    /// Config streamed from an xDS server; the app starts without config (or with whatever
    /// the handle holds) and serves each accepted update.
    pub xds: Option<Xds>,
    pub telemetry: TelemetryOptions,
    /// GRPC_SERVER_USE_TLS: the gRPC listener speaks TLS, with this certificate (re-read from
    /// its files every [`CERT_POLL`]).
    pub grpc_tls: Option<ServerTls>,
    /// GRPC_MAX_CONNECTION_AGE and _GRACE; `None`: connections live for ever.
    pub grpc_connection_age: Option<ConnectionAge>,
    /// SLUICE_MAX_CONNECTIONS and the other limits of every listener.
    pub listener_limits: net::Limits,
    /// SLUICE_PEER_TLS: mutual TLS on the peer listener and on the calls to peers, with one
    /// certificate re-read from its files every [`CERT_POLL`].
    pub peer_tls: Option<PeerTls>,
    /// SLUICE_RLQS_*: the Rate Limit Quota Service.
    pub quota: RlqsOptions,
    /// SPOA_PORT's agent for HAProxy, when set; its listener is in [`Listeners::spoa`].
    pub spoa: Option<api::spoa::SpoaOptions>,
    /// The runtime limits API: its tokens, where the limits are saved, its caps.
    pub runtime_limits: RuntimeLimitsOptions,
}

/// The runtime limits API's validated settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeLimitsOptions {
    /// SLUICE_ADMIN_TOKEN_FILE, read and parsed once here; `None`: the API is off.
    pub admin_token_file: Option<std::path::PathBuf>,
    /// SLUICE_RUNTIME_LIMITS_PATH.
    pub path: Option<std::path::PathBuf>,
    pub max: usize,
    pub history: usize,
    /// SLUICE_RUNTIME_LIMITS_POLL_MS: how often a Redis replica reads the shared changes.
    pub poll: Duration,
    /// SLUICE_RUNTIME_LIMITS_SYNC_MS: how often a peer compares its runtime limits' digest
    /// with one peer's.
    pub sync: Duration,
}

impl Default for RuntimeLimitsOptions {
    fn default() -> Self {
        RuntimeLimitsOptions {
            admin_token_file: None,
            path: None,
            max: crate::config::runtime::DEFAULT_MAX_RUNTIME_LIMITS,
            history: crate::admin::limits::history::DEFAULT_HISTORY,
            poll: Duration::from_millis(250),
            sync: Duration::from_millis(5000),
        }
    }
}

impl RuntimeLimitsOptions {
    /// The API's callers: the token file's, or none.
    pub(crate) fn auth(&self) -> crate::admin::auth::AdminAuth {
        // The file parsed at validation; one that broke since keeps the API off until fixed.
        self.admin_token_file
            .clone()
            .and_then(|f| crate::admin::auth::AdminAuth::from_file(f).ok())
            .unwrap_or_else(crate::admin::auth::AdminAuth::off)
    }
}

/// How often the gRPC listener's certificate files are checked for changes. Kubernetes
/// updates a mounted secret within a minute or so; a second more does not matter.
pub(crate) const CERT_POLL: Duration = Duration::from_secs(1);

/// Every listener, with its limits, before it serves.
struct Ports {
    grpc: net::Port,
    http: net::Port,
    debug: net::Port,
    prometheus: net::Port,
    peer: net::Port,
    budget: Arc<ByteBudget>,
}

/// The longest peer message: a batch of up to 256 forwarded hits whose keys are each capped,
/// with room to spare. Peer messages are reserved from the same budget as client messages.
const PEER_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

impl Ports {
    fn new(options: &AppOptions, grpc_on_unix_socket: bool) -> Self {
        let limits = &options.listener_limits;
        let budget = ByteBudget::new(limits.max_pending_request_bytes);
        let grpc_name = if grpc_on_unix_socket {
            "GRPC_UDS"
        } else {
            "GRPC_PORT"
        };
        Ports {
            // Clients reconnect after GRPC_MAX_CONNECTION_AGE's GOAWAY, so long-lived
            // connections spread again over replicas added since, as envoyproxy/ratelimit's
            // do (without grpc-go's ±10 % jitter).
            grpc: net::Port::grpc(
                grpc_name,
                &limits.for_grpc_clients(),
                options.max_request_bytes,
                budget.clone(),
            )
            .with_tls(options.grpc_tls.as_ref().map(ServerTls::acceptor))
            .with_age(options.grpc_connection_age),
            http: net::Port::http("PORT", limits),
            debug: net::Port::http("DEBUG_PORT", limits),
            prometheus: net::Port::http("PROMETHEUS_ADDR", limits),
            peer: net::Port::grpc("PEER_PORT", limits, PEER_MAX_MESSAGE_BYTES, budget.clone())
                .with_tls(options.peer_tls.as_ref().map(|t| t.server().acceptor())),
            budget,
        }
    }

    /// The counters of every listener that serves, for `/metrics`.
    fn guards(&self, listeners: &Listeners) -> Vec<Arc<PortGuard>> {
        let mut ports = vec![&self.grpc, &self.http, &self.debug];
        if listeners.prometheus.is_some() {
            ports.push(&self.prometheus);
        }
        if listeners.peer.is_some() {
            ports.push(&self.peer);
        }
        ports.iter().map(|p| p.guard()).collect()
    }
}

/// A built, not yet serving, Sluice.
pub struct App {
    options: AppOptions,
    config: ConfigHandle,
    store: Arc<AnyStore>,
    service: Arc<RateLimitService<AnyStore>>,
    /// The service's observer: its stats and span counters, for the debug port.
    telemetry: Arc<DecisionTelemetry>,
    health: Arc<Health>,
    quota: Arc<RlqsService>,
    peer_server: Option<PeerServer>,
    /// Where the runtime limits are shared with other nodes.
    shared: SharedLimits,
    /// TRACING_ENABLED: the finished spans, for the exporter [`App::serve`] starts.
    spans: Option<tokio::sync::mpsc::Receiver<SpanRecord>>,
    /// Wakes the config watcher to load a change at once (SIGHUP).
    reload_now: Arc<tokio::sync::Notify>,
}

impl App {
    /// Must be called inside a tokio runtime (the store's background tasks are spawned).
    pub async fn new(
        options: AppOptions,
        config: ConfigHandle,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StoreError> {
        let limits = MemoryLimits {
            max_counters: options.max_counters,
            max_bytes: options.max_counter_bytes,
        };
        let memory = || MemoryStore::with_sweeper(limits, clock.clone(), options.sweep_interval);
        let store = Arc::new(match (&options.backend, &options.cluster) {
            (Backend::Redis(redis), _) => {
                AnyStore::Redis(RedisStore::start(redis)?.with_give_back(clock.clone()))
            }
            (Backend::Memcache(memcache), _) => {
                AnyStore::Memcache(MemcacheStore::start(memcache).await?)
            }
            (Backend::Memory, None) => AnyStore::Memory(memory()),
            (Backend::Memory, Some(cluster)) => {
                let store = ClusterStore::start(
                    Arc::new(memory()),
                    cluster,
                    options.peer_tls.clone(),
                    clock.clone(),
                )
                .map_err(|e| StoreError::Backend {
                    message: e.to_string(),
                })?;
                AnyStore::Cluster(store)
            }
        });
        let stats = Arc::new(
            Stats::new(options.telemetry.stats).with_max_key_bytes(options.service.max_key_bytes),
        );
        let (tracer, spans) = match &options.telemetry.tracing {
            Some(t) => {
                let (tracer, rx) = Tracer::new(t.sampling_rate, t.max_queue_size);
                (tracer, Some(rx))
            }
            None => (Tracer::disabled(), None),
        };
        let telemetry = Arc::new(DecisionTelemetry::new(stats, Arc::new(tracer)));
        let mut quota = RlqsService::new(config.clone(), clock.clone(), options.quota.clone());
        if let AnyStore::Cluster(cluster) = &*store {
            quota = quota.with_peers(cluster.rlqs_peers(clock.clone()));
        }
        let quota = Arc::new(quota);
        let (shared, peer_server) = share_limits(&options, &config, &store, &quota, &clock)?;
        let service = Arc::new(
            RateLimitService::new(
                config.clone(),
                store.clone(),
                clock,
                options.service.clone(),
            )
            .with_observer(telemetry.clone()),
        );
        let health = Arc::new(
            Health::new(
                config.clone(),
                options.require_config_for_health,
                store.ready_changes(),
            )
            .with_runtime_loaded(shared.loaded()),
        );
        Ok(App {
            options,
            config,
            store,
            service,
            telemetry,
            health,
            quota,
            peer_server,
            shared,
            spans,
            reload_now: Arc::default(),
        })
    }

    /// Notifying it makes the config watcher look at the files at once and load a change
    /// without waiting for it to settle (what SIGHUP does). Without config files (xDS) it does
    /// nothing.
    pub fn reload_trigger(&self) -> Arc<tokio::sync::Notify> {
        self.reload_now.clone()
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
        self.serve_until(listeners, shutdown, std::future::pending())
            .await
    }

    /// [`App::serve`], where `force` completing during the shutdown (a second SIGTERM) ends it
    /// at once, without waiting for in-flight calls or a last telemetry export.
    pub async fn serve_until(
        self,
        listeners: Listeners,
        shutdown: impl Future<Output = ()>,
        force: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        let gave_up = self.store.gave_up();
        let running = self.start(listeners);
        let failure = tokio::select! {
            () = shutdown => None,
            reason = gave_up => Some(reason),
        };
        tokio::pin!(force);
        let stopped = tokio::select! {
            result = running.stop(failure.is_some()) => result,
            () = &mut force => {
                tracing::warn!("second stop signal: exiting without waiting for in-flight calls");
                Ok(())
            }
        };
        match failure {
            Some(reason) => Err(std::io::Error::other(reason)),
            None => stopped,
        }
    }

    /// Starts every listener and background task.
    fn start(self, listeners: Listeners) -> Running {
        let App {
            mut options,
            config,
            store,
            service,
            telemetry,
            health,
            quota,
            peer_server,
            shared,
            spans,
            reload_now,
        } = self;
        let guards = spawn_guards(&mut options, &config, &reload_now);
        let (stop_tx, stop) = StopSignal::new();
        let ports = Ports::new(&options, listeners.grpc.is_unix());
        let (counters, hot) = service_views(&service, &options);
        let limits = limits_api(&options, &config, &service, shared);
        let debug_state = crate::admin::debug::DebugState {
            limits,
            config,
            store,
            stats: telemetry.stats().clone(),
            spans: telemetry
                .tracer()
                .enabled()
                .then(|| telemetry.tracer().counters().clone()),
            listeners: ports.guards(&listeners),
            budget: Some(ports.budget.clone()),
            quota: Some(quota.clone()),
            counters,
            hot,
            clock: service.clock().clone(),
            calls: Arc::default(),
            limit_table: Arc::default(),
        };
        let mut after_drain = vec![health.follow()];
        after_drain.extend(spawn_after_drain(
            &options,
            (ports.peer, ports.prometheus),
            &debug_state,
            (peer_server, listeners.peer, listeners.prometheus),
            &stop,
        ));
        let (otlp_stop_tx, otlp_stop) = StopSignal::new();
        let exporters = spawn_exporters(&options, &debug_state, spans, &otlp_stop);
        let servers = spawn_servers(
            &options,
            (ports.grpc, ports.http, ports.debug),
            (
                listeners.grpc,
                listeners.http,
                listeners.debug,
                listeners.spoa,
            ),
            (service, health.clone(), debug_state),
            (quota, telemetry.tracer().clone()),
            ports.budget.clone(),
            &stop,
        );
        Running {
            health,
            shutdown_delay: options.shutdown_delay,
            drain_timeout: options.drain_timeout,
            servers,
            after_drain,
            exporters,
            stop: stop_tx,
            otlp_stop: otlp_stop_tx,
            _guards: guards,
        }
    }
}

/// The client-facing listeners' servers: gRPC (ratelimit.v3, health, and the Rate Limit Quota
/// Service), HTTP, debug and HAProxy's SPOE agent when it has a listener; and the quota
/// service's tasks.
fn spawn_servers(
    options: &AppOptions,
    (grpc_port, http_port, debug_port): (net::Port, net::Port, net::Port),
    (grpc, http, debug, spoa): (GrpcListener, TcpListener, TcpListener, Option<TcpListener>),
    (service, health, debug_state): (
        Arc<RateLimitService<AnyStore>>,
        Arc<Health>,
        crate::admin::debug::DebugState,
    ),
    (quota, tracer): (Arc<RlqsService>, Arc<Tracer>),
    budget: Arc<ByteBudget>,
    stop: &StopSignal,
) -> Vec<(&'static str, tokio::task::JoinHandle<()>)> {
    let rlqs = api::rlqs::server(quota.clone(), tracer, options.max_request_bytes);
    let grpc_routes = api::grpc::routes(service.clone(), health.clone(), options.max_request_bytes)
        .add_service(rlqs);
    let spoa = spoa.zip(options.spoa).map(|(listener, spoa_options)| {
        let limits = options.listener_limits.clone();
        let agent = api::spoa::serve(
            listener,
            service.clone(),
            (spoa_options, limits, budget),
            stop.wait(),
        );
        ("SPOA", tokio::spawn(agent))
    });
    let http_router = api::http::router(service, health, options.max_request_bytes);
    let [sync, sweep] = spawn_quota(quota, stop);
    let mut servers = vec![
        sync,
        sweep,
        (
            "gRPC",
            tokio::spawn(grpc_port.serve(grpc, grpc_routes.prepare(), stop.wait())),
        ),
        (
            "HTTP",
            tokio::spawn(http_port.serve(http, http_router, stop.wait())),
        ),
        (
            "debug",
            tokio::spawn(debug_port.serve(
                debug,
                crate::admin::debug::router(debug_state),
                stop.wait(),
            )),
        ),
    ];
    servers.extend(spoa);
    servers
}

/// The quota service's tasks: the sweep, and with peers the sync with its buckets' owners.
fn spawn_quota(
    quota: Arc<RlqsService>,
    stop: &StopSignal,
) -> [(&'static str, tokio::task::JoinHandle<()>); 2] {
    [
        (
            "RLQS sync",
            tokio::spawn(quota.clone().run_sync(stop.wait())),
        ),
        ("RLQS sweep", tokio::spawn(sweep_quota(quota, stop.wait()))),
    ]
}

/// Frees expired and quiet parts of the quota service's buckets every second, until the app
/// stops; then ends the streams, which would otherwise hold the drain for its whole timeout.
async fn sweep_quota(quota: Arc<RlqsService>, stop: impl Future<Output = ()>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = tick.tick() => quota.sweep(),
            () = &mut stop => {
                quota.close_streams();
                return;
            }
        }
    }
}

/// What is stopped after the drain: the peer listener (other nodes may still forward hits while
/// this one drains), the Prometheus listener and statsd.
fn spawn_after_drain(
    options: &AppOptions,
    (peer_port, prometheus_port): (net::Port, net::Port),
    debug_state: &crate::admin::debug::DebugState,
    (peer_server, peer, prometheus): (Option<PeerServer>, Option<TcpListener>, Option<TcpListener>),
    stop: &StopSignal,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    if let (Some(server), Some(listener)) = (peer_server, peer) {
        tasks.push(tokio::spawn(peer_port.serve(listener, server, stop.wait())));
    }
    if let Some(listener) = prometheus {
        let path = &options.telemetry.prometheus_path;
        let router = crate::admin::debug::metrics_router(path, debug_state.clone());
        tasks.push(tokio::spawn(prometheus_port.serve(
            listener,
            router,
            stop.wait(),
        )));
    }
    tasks.extend(spawn_statsd(options, debug_state));
    tasks
}

/// A stop flag that any number of tasks wait on.
#[derive(Clone)]
struct StopSignal(watch::Receiver<bool>);

impl StopSignal {
    fn new() -> (watch::Sender<bool>, Self) {
        let (tx, rx) = watch::channel(false);
        (tx, StopSignal(rx))
    }

    /// Completes once the flag is set (or its sender is gone, which also means stop).
    fn wait(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.0.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    }
}

/// USE_STATSD: pushes the counters every STATS_FLUSH_INTERVAL.
fn spawn_statsd(
    options: &AppOptions,
    state: &crate::admin::debug::DebugState,
) -> Option<tokio::task::JoinHandle<()>> {
    let (addr, interval) = options.telemetry.statsd?;
    let state = state.clone();
    Some(tokio::spawn(async move {
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
            if let Err(e) = sink.flush(&state.stats, &state.extra()).await
                && let Some(suppressed) = failures.check()
            {
                tracing::warn!(%addr, error = %e, suppressed, "statsd flush failed");
            }
        }
    }))
}

/// The OTLP exporters (spans, metrics), each with the time its last export may take. They stop
/// after the drain, so the last calls' spans are sent too.
fn spawn_exporters(
    options: &AppOptions,
    state: &crate::admin::debug::DebugState,
    spans: Option<tokio::sync::mpsc::Receiver<SpanRecord>>,
    stop: &StopSignal,
) -> Vec<(tokio::task::JoinHandle<()>, Duration)> {
    let mut exporters = Vec::new();
    if let (Some(t), Some(rx), Some(counters)) =
        (&options.telemetry.tracing, spans, state.spans.clone())
    {
        let task =
            crate::telemetry::otlp::export::run_span_exporter(t.clone(), rx, counters, stop.wait());
        exporters.push((tokio::spawn(task), t.endpoint.timeout));
    }
    if let Some(m) = &options.telemetry.otlp_metrics {
        let state = state.clone();
        let task = crate::telemetry::otlp::export::run_metrics_exporter(
            m.clone(),
            state.stats.clone(),
            move || state.extra(),
            stop.wait(),
        );
        exporters.push((tokio::spawn(task), m.endpoint.timeout));
    }
    exporters
}

/// What a serving app runs, until [`Running::stop`].
struct Running {
    health: Arc<Health>,
    /// SLUICE_SHUTDOWN_DELAY_SECS and SLUICE_DRAIN_TIMEOUT_SECS.
    shutdown_delay: Duration,
    drain_timeout: Duration,
    /// The client-facing listeners, whose in-flight calls the drain waits for.
    servers: Vec<(&'static str, tokio::task::JoinHandle<()>)>,
    /// Stopped once the drain is over: the peer and Prometheus listeners, statsd, and the
    /// task that keeps health in step with the config and the backend.
    after_drain: Vec<tokio::task::JoinHandle<()>>,
    exporters: Vec<(tokio::task::JoinHandle<()>, Duration)>,
    stop: watch::Sender<bool>,
    otlp_stop: watch::Sender<bool>,
    /// The config watcher, the xDS client and the certificate watchers stop when dropped.
    _guards: Guards,
}

/// The config watcher, the xDS client and the gRPC and peer certificate watchers.
type Guards = (
    Option<crate::config::WatchGuard>,
    Option<crate::xds::XdsGuard>,
    Option<crate::tls::TaskGuard>,
    Option<crate::tls::TaskGuard>,
);

/// Starts what runs beside the listeners until the app stops: the config watcher (taking the
/// reload options: the poller holds the bytes of the files it last loaded), the xDS client,
/// and the reloading of the gRPC and peer certificates when their files change (the peer one
/// serves both sides of peer TLS).
fn spawn_guards(
    options: &mut AppOptions,
    config: &ConfigHandle,
    reload_now: &Arc<tokio::sync::Notify>,
) -> Guards {
    let watcher = options.reload.take().map(|r| {
        crate::config::spawn_watcher(r.poller, config.clone(), r.poll, reload_now.clone())
    });
    let xds = options
        .xds
        .as_ref()
        .map(|x| crate::xds::spawn(x.settings.clone(), x.tls.clone(), x.options, config.clone()));
    (
        watcher,
        xds,
        options.grpc_tls.as_ref().map(|tls| tls.watch(CERT_POLL)),
        options
            .peer_tls
            .as_ref()
            .map(|tls| tls.server().watch(CERT_POLL)),
    )
}

impl Running {
    /// Health fails, then (unless the backend gave up) `shutdown_delay` passes, the listeners
    /// stop accepting and in-flight calls get up to `drain_timeout`; then the rest stops and
    /// the OTLP exporters send what is queued, each within its export timeout.
    async fn stop(self, gave_up: bool) -> std::io::Result<()> {
        tracing::info!("shutting down: health now failing");
        self.health.fail_sigterm();
        if !gave_up {
            tokio::time::sleep(self.shutdown_delay).await;
        }
        let _ = self.stop.send(true);
        let names: Vec<&str> = self.servers.iter().map(|(n, _)| *n).collect();
        let joined = futures_util::future::join_all(self.servers.into_iter().map(|(_, t)| t));
        let drained = tokio::time::timeout(self.drain_timeout, joined).await;
        for task in &self.after_drain {
            task.abort();
        }
        let _ = self.otlp_stop.send(true);
        for (task, timeout) in self.exporters {
            let abort = task.abort_handle();
            // A last export of what is queued, bounded by the export timeout (plus a margin).
            if tokio::time::timeout(timeout + Duration::from_millis(500), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        let Ok(results) = drained else {
            tracing::warn!(
                timeout = ?self.drain_timeout,
                "in-flight calls did not finish before the drain timeout"
            );
            return Ok(());
        };
        // A server task only fails by panicking.
        for (what, joined) in names.into_iter().zip(results) {
            joined.map_err(|e| std::io::Error::other(format!("{what} server task: {e}")))?;
        }
        Ok(())
    }
}

/// The debug port's views of the service: the counter admin and the hot keys.
/// Where a node's runtime limits are shared: with its peers (a peer cluster), or through Redis
/// (BACKEND_TYPE=redis); neither for a lone node.
#[derive(Default)]
struct SharedLimits {
    peers: Option<Arc<crate::cluster::runtime_peers::PeerLimits>>,
    redis: Option<Arc<crate::runtime_limits::redis::RedisLimits>>,
}

impl SharedLimits {
    /// Whether their first load is done: the first pull from a peer (or the wait for one),
    /// Redis's hash; always for a node that shares none.
    fn loaded(&self) -> tokio::sync::watch::Receiver<bool> {
        match (&self.peers, &self.redis) {
            (Some(peers), _) => peers.loaded(),
            (None, Some(redis)) => redis.loaded(),
            (None, None) => tokio::sync::watch::channel(true).1,
        }
    }
}

/// Shares the runtime limits as the store calls for; a peer cluster's listener service, which
/// answers the peers' `Limits` calls among the others.
fn share_limits(
    options: &AppOptions,
    config: &ConfigHandle,
    store: &AnyStore,
    quota: &Arc<RlqsService>,
    clock: &Arc<dyn Clock>,
) -> Result<(SharedLimits, Option<PeerServer>), StoreError> {
    let mut shared = SharedLimits::default();
    if let Backend::Redis(redis) = &options.backend {
        shared.redis = Some(crate::runtime_limits::redis::RedisLimits::start(
            redis,
            &options.service.cache_key_prefix,
            config.clone(),
            options.runtime_limits.poll,
        )?);
    }
    let mut peer_server = None;
    if let AnyStore::Cluster(cluster) = store {
        shared.peers = cluster.runtime_limits(config.clone(), options.runtime_limits.sync);
        peer_server = Some(PeerServer::new(
            cluster.owner().clone(),
            clock.clone(),
            Some(quota.clone()),
            shared
                .peers
                .clone()
                .map(|l| l as Arc<dyn crate::cluster::peer::LimitsOwner>),
        ));
    }
    Ok((shared, peer_server))
}

/// The runtime limits API's state; with SLUICE_RUNTIME_LIMITS_PATH, the task that saves them.
fn limits_api(
    options: &AppOptions,
    config: &ConfigHandle,
    service: &Arc<RateLimitService<AnyStore>>,
    shared: SharedLimits,
) -> Arc<crate::admin::limits::LimitsApi> {
    let o = &options.runtime_limits;
    let mut sinks: Vec<Arc<dyn crate::runtime_limits::Sink>> = Vec::new();
    if let Some(peers) = shared.peers {
        sinks.push(peers);
    }
    if let Some(redis) = shared.redis {
        sinks.push(redis);
    }
    if let Some(path) = &o.path {
        // The task lives as long as the runtime: a save in progress at exit leaves at most
        // its temporary file, and every change was answered only once saved.
        let (saver, _task) =
            crate::config::runtime::file::Saver::spawn(config.clone(), path.clone());
        sinks.push(saver);
    }
    Arc::new(crate::admin::limits::LimitsApi::new(
        config.clone(),
        o.auth(),
        o.history,
        service.clock().clone(),
        service.clone(),
        sinks,
        Arc::from(
            options
                .cluster
                .as_ref()
                .map_or("", |c| c.advertise.as_str()),
        ),
    ))
}

fn service_views(
    service: &Arc<RateLimitService<AnyStore>>,
    options: &AppOptions,
) -> (
    crate::admin::debug::CounterAdmin,
    Arc<crate::service::HotKeys>,
) {
    let admin = crate::admin::debug::CounterAdmin {
        service: service.clone(),
        reset_enabled: options.counter_reset,
        max_request_bytes: options.max_request_bytes,
    };
    (admin, service.hot_keys().clone())
}
