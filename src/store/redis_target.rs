//! One Redis target (REDIS_URL's, REDIS_PERSECOND_URL's, the write-behind's): its connection,
//! its breaker ([`super::breaker`]) and the task that supervises them.
//!
//! The supervisor makes every connection the target uses. At start it checks Redis on the
//! REDIS_STARTUP_* schedule (and gives up after REDIS_STARTUP_MAX_ELAPSED_TIME); once Redis
//! has answered, it waits for the breaker to open and probes until Redis answers again. A check
//! and a probe are the same: a new connection (a new cluster connection on Redis Cluster; the
//! Sentinel watcher's master otherwise), a PING (to every master of a cluster) and the scripts
//! loaded, within max(REDIS_TIMEOUT, 1 s). The connection that passed is installed, and calls
//! use it until it fails: connections do not reconnect by themselves, so no call ever waits
//! for a reconnection.
//!
//! A failover that repoints an address (a Kubernetes Service, DNS, a proxy) at the new master
//! leaves the connection on the demoted one, which answers every write READONLY for as long as
//! the connection lasts. With REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR (on by default) such a
//! reply opens the breaker, and until a new connection reaches a master (ROLE says `master`;
//! a server or proxy that does not know ROLE is taken at its word) the checks go on, so a
//! probe that reaches the demoted server again before the address moves does not reinstall it.
//! A Sentinel group's master follows a demotion by itself, through the sentinels.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, ErrorKind, RedisError, ServerErrorKind, Value};

use super::StoreError;
use super::breaker::{Breaker, BreakerSettings, BreakerStats, REDIS, Readiness};
use super::redis_client::{
    RedisAddress, RedisNode, RedisTarget, RedisTopology, StartupBackoff, certificates, client,
    client_with, connection_info,
};
use super::redis_sentinel::{Lookup, SentinelMaster};

/// One Redis, one Redis Cluster, or the master of a Sentinel group.
pub(super) enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
    Sentinel(Arc<SentinelMaster>),
}

impl Conn {
    pub(super) async fn query(&self, pipe: &redis::Pipeline) -> Result<Vec<Value>, RedisError> {
        match self {
            Conn::Single(c) => pipe.query_async(&mut c.clone()).await,
            Conn::Cluster(c) => pipe.query_async(&mut c.clone()).await,
            Conn::Sentinel(s) => s.pipe(pipe).await,
        }
    }

    /// A call on this connection missed its deadline.
    fn deadline_missed(&self) {
        if let Conn::Sentinel(s) = self {
            // The master may be gone without a word (a partition): look again.
            s.deadline_missed();
        }
    }

    /// PING; on a cluster, every master must answer.
    async fn ping(&self) -> Result<(), RedisError> {
        use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
        match self {
            Conn::Cluster(c) => {
                let routing = RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllMasters,
                    Some(ResponsePolicy::AllSucceeded),
                ));
                c.clone()
                    .route_command(redis::cmd("PING"), routing)
                    .await
                    .map(drop)
            }
            _ => {
                let mut pipe = redis::pipe();
                pipe.cmd("PING");
                self.query(&pipe).await.map(drop)
            }
        }
    }

    /// The server must be a master: after a READONLY reply, a check that reaches the demoted
    /// server again (the address not moved yet) must fail. ROLE's first element says it; an
    /// error (a proxy that does not know ROLE) cannot tell, and passes.
    async fn require_master(&self) -> Result<(), RedisError> {
        let mut pipe = redis::pipe();
        pipe.cmd("ROLE");
        let role = match self.query(&pipe).await {
            Ok(values) => values,
            Err(e) if e.kind() == ErrorKind::Io || e.is_timeout() => return Err(e),
            Err(_) => return Ok(()),
        };
        let role = match role.first() {
            Some(Value::Array(items)) => match items.first() {
                Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                Some(Value::SimpleString(s)) => s.clone(),
                _ => return Ok(()),
            },
            _ => return Ok(()),
        };
        if role == "master" {
            return Ok(());
        }
        Err(RedisError::from((
            ErrorKind::Server(ServerErrorKind::ReadOnly),
            "still a replica",
            format!(
                "ROLE says {role}: the address does not reach the new master yet \
                 (REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR)"
            ),
        )))
    }

    pub(super) async fn load(&self, scripts: &[&str]) -> Result<(), RedisError> {
        for script in scripts {
            let mut cmd = redis::cmd("SCRIPT");
            cmd.arg("LOAD").arg(script);
            match self {
                Conn::Single(c) => {
                    let _: String = cmd.query_async(&mut c.clone()).await?;
                }
                Conn::Sentinel(s) => {
                    s.cmd(&cmd).await?;
                }
                Conn::Cluster(c) => {
                    // Every primary must know the scripts.
                    let routing = redis::cluster_routing::RoutingInfo::MultiNode((
                        redis::cluster_routing::MultipleNodeRoutingInfo::AllMasters,
                        None,
                    ));
                    c.clone().route_command(cmd, routing).await?;
                }
            }
        }
        Ok(())
    }
}

/// What every target of one store shares.
pub(super) struct TargetOptions {
    /// REDIS_TIMEOUT.
    pub timeout: Duration,
    pub startup: StartupBackoff,
    /// Set once a start-up check gave up (REDIS_STARTUP_MAX_ELAPSED_TIME).
    pub gave_up: tokio::sync::watch::Sender<Option<String>>,
    pub breaker: BreakerSettings,
    pub readiness: Arc<Readiness>,
    /// Loaded by every check, so a restarted Redis knows them before the first call.
    pub scripts: &'static [&'static str],
}

impl TargetOptions {
    /// The bound on making a connection and on a whole check: a TLS handshake on a busy
    /// machine may need more than a short REDIS_TIMEOUT.
    fn connect_timeout(&self) -> Duration {
        self.timeout.max(Duration::from_secs(1))
    }

    fn connection_config(&self) -> AsyncConnectionConfig {
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout()))
            .set_response_timeout(Some(self.timeout))
    }
}

/// A Redis that may not be connected yet, and its breaker.
pub(super) struct Target {
    /// `None` until the first check passed (a Sentinel group: the watcher's, from the start).
    conn: ArcSwapOption<Conn>,
    breaker: Breaker,
    /// A READONLY reply opened the breaker: checks pass only on a master until one does.
    after_readonly: AtomicBool,
    spec: RedisTarget,
    cluster: bool,
}

impl Target {
    /// Builds the target and spawns its supervisor (and a Sentinel group's watcher) onto
    /// `tasks`. `role` names it in the stats: `main`, `per_second` or `write_behind`.
    pub(super) fn start(
        role: &'static str,
        spec: &RedisTarget,
        options: &Arc<TargetOptions>,
        tasks: &mut Vec<tokio::task::JoinHandle<()>>,
    ) -> Result<Arc<Target>, StoreError> {
        if spec.tls.is_some() {
            // rustls needs a process-wide provider: ring, as everywhere in Sluice. An error
            // means one is installed already.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        // Credentials stay out of messages and logs.
        let tls = spec.tls.is_some();
        let names: Vec<String> = spec.nodes.iter().map(|n| n.name(tls)).collect();
        let t = Arc::new(Target {
            conn: ArcSwapOption::empty(),
            after_readonly: AtomicBool::new(false),
            breaker: Breaker::new(
                REDIS,
                role,
                names.join(","),
                options.breaker,
                options.readiness.clone(),
            ),
            spec: spec.clone(),
            cluster: spec.topology == RedisTopology::Cluster,
        });
        let bad_node = |e: RedisError| StoreError::Backend {
            message: e.to_string(),
        };
        match &spec.topology {
            // The node is checked now, so a bad one stops start-up rather than every check.
            RedisTopology::Single => drop(
                single_node(spec)
                    .and_then(unix_hint)
                    .and_then(|node| client(node, node.auth.as_ref(), spec.tls.as_ref()))
                    .map_err(bad_node)?,
            ),
            RedisTopology::Cluster => {}
            RedisTopology::Sentinel {
                master_name,
                master_auth,
                master_credentials,
            } => {
                // The sentinels are checked now; each lookup makes its clients, with the
                // credentials as they are then.
                for node in &spec.nodes {
                    drop(client(node, node.auth.as_ref(), spec.tls.as_ref()).map_err(bad_node)?);
                }
                let (master, task) = SentinelMaster::start(Lookup {
                    sentinels: spec.nodes.clone(),
                    sentinel_credentials: spec.credentials.clone(),
                    master_name: master_name.clone(),
                    master_auth: master_auth.clone(),
                    master_credentials: master_credentials.clone(),
                    tls: spec.tls.clone(),
                    config: options.connection_config(),
                    connect_timeout: options.connect_timeout(),
                });
                tasks.push(task);
                t.conn.store(Some(Arc::new(Conn::Sentinel(master))));
            }
        }
        tasks.push(tokio::spawn(t.clone().supervise(options.clone())));
        Ok(t)
    }

    /// Whether it is Redis Cluster, where each key's commands go to its own node.
    pub(super) fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// True once Redis has answered its first check.
    pub(super) fn has_answered(&self) -> bool {
        self.breaker.has_answered()
    }

    pub(super) fn stats(&self) -> BreakerStats {
        self.breaker.stats()
    }

    /// Start-up checks until Redis first answers (or the store gives up), then a probe
    /// whenever the breaker opens.
    async fn supervise(self: Arc<Self>, options: Arc<TargetOptions>) {
        if !self.start_up(&options).await {
            return;
        }
        loop {
            self.breaker.wait_open().await;
            self.probe(&options).await;
        }
    }

    /// Checks on the REDIS_STARTUP_* schedule; false if REDIS_STARTUP_MAX_ELAPSED_TIME passed.
    async fn start_up(&self, options: &TargetOptions) -> bool {
        let started = tokio::time::Instant::now();
        let startup = options.startup;
        let mut delay = startup.initial;
        loop {
            let e = match self.check(options).await {
                Ok(()) => return true,
                Err(e) => e,
            };
            self.breaker.still_down(&e);
            if let Some(limit) = startup.max_elapsed
                && started.elapsed() + delay > limit
            {
                // The next try would come after the limit: give up now, as the Go service's
                // backoff does.
                let reason = format!(
                    "Redis {} did not answer within REDIS_STARTUP_MAX_ELAPSED_TIME \
                     ({limit:?}): {e}",
                    self.breaker.name()
                );
                tracing::error!("{reason}");
                options.gave_up.send_replace(Some(reason));
                return false;
            }
            tracing::warn!(redis = %self.breaker.name(), error = %e, retry_in = ?delay, "Redis not ready");
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(startup.max);
        }
    }

    /// Probes at once, then every probe interval, until Redis answers.
    async fn probe(&self, options: &TargetOptions) {
        loop {
            match self.check(options).await {
                Ok(()) => return,
                Err(e) => self.breaker.still_down(e),
            }
            tokio::time::sleep(options.breaker.probe_interval).await;
        }
    }

    /// One check: on success the new connection is installed and the breaker closed.
    async fn check(&self, options: &TargetOptions) -> Result<(), RedisError> {
        let limit = options.connect_timeout();
        let checked = tokio::time::timeout(limit, self.connect(options))
            .await
            .unwrap_or_else(|_| {
                Err(RedisError::from((
                    ErrorKind::Io,
                    "no answer",
                    format!("Redis did not answer within {limit:?} (max(REDIS_TIMEOUT, 1s))"),
                )))
            });
        match checked {
            Ok(conn) => {
                self.conn.store(Some(conn));
                self.after_readonly.store(false, Ordering::Relaxed);
                self.breaker.close();
                Ok(())
            }
            Err(e) => {
                // A Sentinel group's master that failed a check is looked up again: it may
                // be hung, and the sentinels may still name it.
                if let Some(conn) = self.conn.load_full() {
                    conn.deadline_missed();
                }
                Err(e)
            }
        }
    }

    /// A connection that has answered a PING and holds the scripts.
    async fn connect(&self, options: &TargetOptions) -> Result<Arc<Conn>, RedisError> {
        let spec = &self.spec;
        let conn = match &spec.topology {
            // The credentials are read again for every connection (REDIS_AUTH_FILE).
            RedisTopology::Single => Arc::new(Conn::Single(
                client_with(single_node(spec)?, spec.tls.as_ref(), &spec.credentials)?
                    .get_multiplexed_async_connection_with_config(&options.connection_config())
                    .await?,
            )),
            RedisTopology::Cluster => {
                // The credentials file is read once for all the seeds: redis-rs refuses seeds
                // with different credentials.
                let from_file = spec.credentials.current()?;
                let tls = spec.tls.is_some();
                let seeds = spec
                    .nodes
                    .iter()
                    .map(|n| connection_info(n, from_file.as_ref().or(n.auth.as_ref()), tls))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut builder = ClusterClient::builder(seeds)
                    .connection_timeout(options.connect_timeout())
                    .response_timeout(options.timeout);
                if let Some(tls) = &spec.tls {
                    builder = builder
                        .certs(certificates(tls))
                        .danger_accept_invalid_hostnames(tls.skip_hostname_verification);
                }
                Arc::new(Conn::Cluster(
                    builder.build()?.get_async_connection().await?,
                ))
            }
            RedisTopology::Sentinel { .. } => self
                .conn
                .load_full()
                .ok_or_else(|| RedisError::from((ErrorKind::Io, "no Sentinel watcher")))?,
        };
        conn.ping().await?;
        if self.after_readonly.load(Ordering::Relaxed) && !self.cluster {
            conn.require_master().await?;
        }
        conn.load(options.scripts).await?;
        Ok(conn)
    }

    /// A call on `conn` was answered READONLY: with REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR,
    /// the breaker opens and the probe replaces the connection; else, as any error Redis
    /// answers, it says Redis is there. A Sentinel group's master follows a demotion by itself
    /// (it asks the sentinels again, `super::redis_sentinel`).
    fn readonly(&self, conn: &Conn, e: &RedisError) {
        if !self.breaker.settings().reconnect_on_readonly || matches!(conn, Conn::Sentinel(_)) {
            self.breaker.answered();
            return;
        }
        self.after_readonly.store(true, Ordering::Relaxed);
        self.breaker.connection_failed(format!(
            "{e}: the server behind the connection is a read-only replica now (a failover?); \
             reconnecting until the address reaches a master \
             (REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR)"
        ));
    }

    /// The connection to call on, unless the breaker says to answer at once. Calls made while
    /// the very first connection is being made wait for it, until `deadline`, as they would on
    /// any connection being opened: a node's first calls (the write-behind's take-over loads
    /// above all) need Redis most, and a Redis that is down fails that attempt quickly.
    async fn usable(&self, deadline: tokio::time::Instant) -> Result<Arc<Conn>, StoreError> {
        if self.breaker.first_attempt_pending() {
            let _ = tokio::time::timeout_at(deadline, self.breaker.first_attempt()).await;
        }
        self.breaker.check()?;
        self.conn.load_full().ok_or_else(|| StoreError::Backend {
            message: "not connected to Redis yet".into(),
        })
    }

    /// Whether a call made on `conn` says anything about the connection calls use now: a
    /// replaced connection's failures do not open the breaker again.
    fn is_current(&self, conn: &Arc<Conn>) -> bool {
        self.conn
            .load()
            .as_ref()
            .is_some_and(|current| Arc::ptr_eq(current, conn))
    }
}

/// A socket path that is really `host:port` (a REDIS_URL under the unix socket type, the Go
/// service's default, which fails there too): the error says what to change.
fn unix_hint(node: &RedisNode) -> Result<&RedisNode, RedisError> {
    let RedisAddress::Unix(path) = &node.address else {
        return Ok(node);
    };
    let addr = path.to_string_lossy();
    let tcp_like = !addr.contains('/')
        && addr
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !tcp_like {
        return Ok(node);
    }
    Err(RedisError::from((
        ErrorKind::InvalidClientConfig,
        "not a socket path",
        format!(
            "{addr} is host:port, but the socket type is unix (REDIS_SOCKET_TYPE's default, as in \
             envoyproxy/ratelimit): set REDIS_SOCKET_TYPE=tcp (REDIS_PERSECOND_SOCKET_TYPE for the \
             per-second Redis), or give the socket's path"
        ),
    )))
}

/// The one node of a REDIS_TYPE=single target.
fn single_node(spec: &RedisTarget) -> Result<&RedisNode, RedisError> {
    spec.nodes
        .first()
        .ok_or_else(|| RedisError::from((ErrorKind::InvalidClientConfig, "no Redis address")))
}

/// Runs `pipe` on `target` within `timeout`; on NOSCRIPT loads `scripts` and retries once.
/// While the target's breaker is open it answers at once.
pub(super) async fn run_within(
    target: &Target,
    pipe: &redis::Pipeline,
    timeout: Duration,
    scripts: &[&str],
) -> Result<Vec<Value>, StoreError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let conn = target.usable(deadline).await?;
    let attempt = async {
        match conn.query(pipe).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                conn.load(scripts).await?;
                conn.query(pipe).await
            }
            other => other,
        }
    };
    let current = || target.is_current(&conn);
    match tokio::time::timeout_at(deadline, attempt).await {
        Ok(Ok(values)) => {
            if current() {
                target.breaker.answered();
            }
            Ok(values)
        }
        Ok(Err(e)) if e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly) => {
            if current() {
                target.readonly(&conn, &e);
            }
            Err(StoreError::Backend {
                message: e.to_string(),
            })
        }
        Ok(Err(e)) if !e.is_timeout() => {
            if current() {
                target.breaker.failed(&e);
            }
            Err(StoreError::Backend {
                message: e.to_string(),
            })
        }
        // The connection's own response timeout (REDIS_TIMEOUT too) or ours, whichever came
        // first: one message for both.
        Ok(Err(_)) | Err(_) => {
            let message = format!("Redis did not answer within {timeout:?} (REDIS_TIMEOUT)");
            if current() && target.breaker.timed_out(&message) {
                conn.deadline_missed();
            }
            Err(StoreError::Backend { message })
        }
    }
}
