//! REDIS_TYPE=sentinel: the master the sentinels name, one multiplexed connection to it, and
//! failovers followed.
//!
//! A watcher task owns the lookup: it asks the sentinels in turn `SENTINEL
//! GET-MASTER-ADDR-BY-NAME <name>` (with REDIS_SENTINEL_AUTH), connects to the address the first
//! one answers (with REDIS_AUTH) and checks with `ROLE` that the node is a master, since a
//! sentinel may not have seen a failover yet. TLS, when on, applies to sentinels and master alike,
//! as in Go. Requests only read the current connection and never wait for a lookup.
//!
//! **Failover.** A call that fails with a connection error or `READONLY` (the old master,
//! demoted; a Sentinel failover also closes its clients) drops the connection and wakes the
//! watcher; so does the target's breaker when missed deadlines open it (one slow call does
//! not: see [`super::breaker`]). Until it has a master again calls fail at once (a backend error, answered as
//! UNKNOWN or fail-open), and it looks up every [`RETRY_MIN`] doubling to [`RETRY_MAX`]. So once
//! the sentinels have promoted a replica, Sluice uses it within [`RETRY_MAX`] plus one lookup
//! (each sentinel asked and the master reached within max(REDIS_TIMEOUT, 1 s)). While healthy
//! the watcher still asks every [`CHECK_EVERY`], so a master that moved without failing a call
//! (a partitioned old master still accepting writes) is left within that time.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, RedisError, ServerErrorKind, Value};
use tokio::sync::Notify;

use super::redis_client::{Auth, Credentials, RedisAddress, RedisNode, RedisTls, client_with};

/// First retry delay while no master answers.
pub(super) const RETRY_MIN: Duration = Duration::from_millis(200);
/// Longest retry delay while no master answers.
pub(super) const RETRY_MAX: Duration = Duration::from_secs(1);
/// How often a healthy connection's master is checked against the sentinels.
pub(super) const CHECK_EVERY: Duration = Duration::from_secs(5);

/// The current master, if any.
pub(super) struct SentinelMaster {
    current: ArcSwapOption<Master>,
    wake: Notify,
    /// Why the last lookup failed, for the errors calls get meanwhile.
    last_error: ArcSwapOption<String>,
}

struct Master {
    /// `host:port`, as the sentinels name it.
    addr: String,
    conn: MultiplexedConnection,
}

/// How to find and reach the master.
pub(super) struct Lookup {
    /// The sentinels; a client is made for each lookup, with `sentinel_credentials` as they
    /// are then.
    pub sentinels: Vec<RedisNode>,
    pub sentinel_credentials: Credentials,
    pub master_name: String,
    /// REDIS_AUTH, for the master; `None`: no AUTH.
    pub master_auth: Option<Auth>,
    /// REDIS_AUTH_FILE, read for every connection to a master.
    pub master_credentials: Credentials,
    pub tls: Option<RedisTls>,
    pub config: AsyncConnectionConfig,
    pub connect_timeout: Duration,
}

fn io_error(message: String) -> RedisError {
    RedisError::from((ErrorKind::Io, "Redis Sentinel", message))
}

/// Errors after which the master may have moved. A timeout alone is not one: the breaker
/// counts them and calls [`SentinelMaster::deadline_missed`] when they add up.
fn master_lost(e: &RedisError) -> bool {
    !e.is_timeout()
        && (e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly))
}

impl SentinelMaster {
    /// Starts the watcher; the master is found in the background.
    pub(super) fn start(lookup: Lookup) -> (Arc<Self>, tokio::task::JoinHandle<()>) {
        let master = Arc::new(SentinelMaster {
            current: ArcSwapOption::empty(),
            wake: Notify::new(),
            last_error: ArcSwapOption::empty(),
        });
        let task = tokio::spawn(master.clone().watch(lookup));
        (master, task)
    }

    fn connection(&self) -> Result<Arc<Master>, RedisError> {
        self.current.load_full().ok_or_else(|| {
            let last = match self.last_error.load().as_deref() {
                Some(e) => format!("; last lookup: {e}"),
                None => String::new(),
            };
            io_error(format!(
                "no Redis master yet: asking the sentinels (REDIS_TYPE=sentinel){last}"
            ))
        })
    }

    /// After a failed call on `master`: forget it (unless already replaced) and look again.
    fn failed(&self, master: &Arc<Master>, e: &RedisError) {
        if master_lost(e) {
            self.current
                .compare_and_swap(&Some(master.clone()), None::<Arc<Master>>);
            self.wake.notify_one();
        }
    }

    /// Called when calls on the master keep missing their deadline: look again.
    pub(super) fn deadline_missed(&self) {
        if let Some(master) = self.current.load_full() {
            self.failed(&master, &io_error("deadline missed".into()));
        }
    }

    pub(super) async fn pipe(&self, pipe: &redis::Pipeline) -> Result<Vec<Value>, RedisError> {
        let master = self.connection()?;
        let reply = pipe.query_async(&mut master.conn.clone()).await;
        if let Err(e) = &reply {
            self.failed(&master, e);
        }
        reply
    }

    pub(super) async fn cmd(&self, cmd: &redis::Cmd) -> Result<Value, RedisError> {
        let master = self.connection()?;
        let reply = cmd.query_async(&mut master.conn.clone()).await;
        if let Err(e) = &reply {
            self.failed(&master, e);
        }
        reply
    }

    async fn watch(self: Arc<Self>, lookup: Lookup) {
        let mut delay = RETRY_MIN;
        loop {
            let current = self.current.load_full();
            match lookup.find(current.as_deref()).await {
                Ok(Some(found)) => {
                    self.last_error.store(None);
                    tracing::info!(master = %found.addr, name = %lookup.master_name, "Redis master found through the sentinels");
                    self.current.store(Some(Arc::new(found)));
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(name = %lookup.master_name, error = %e, "Redis master not found through the sentinels");
                    self.last_error.store(Some(Arc::new(e.to_string())));
                }
            }
            if self.current.load().is_some() {
                delay = RETRY_MIN;
                tokio::select! {
                    () = self.wake.notified() => {}
                    () = tokio::time::sleep(CHECK_EVERY) => {}
                }
            } else {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(RETRY_MAX);
            }
        }
    }
}

impl Lookup {
    /// The master the first answering sentinel names: `None` if it is `current`'s.
    async fn find(&self, current: Option<&Master>) -> Result<Option<Master>, RedisError> {
        let mut last = io_error("no sentinel configured".into());
        for sentinel in &self.sentinels {
            let asked = match client_with(sentinel, self.tls.as_ref(), &self.sentinel_credentials) {
                Ok(sentinel) => self.ask(&sentinel).await,
                Err(e) => Err(e),
            };
            let (host, port) = match asked {
                Ok(addr) => addr,
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            let addr = if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            };
            if current.is_some_and(|m| m.addr == addr) {
                return Ok(None);
            }
            match self.connect_master(host, port, &addr).await {
                Ok(conn) => return Ok(Some(Master { addr, conn })),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    async fn bounded<T>(
        &self,
        what: &str,
        f: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, RedisError> {
        tokio::time::timeout(self.connect_timeout, f)
            .await
            .unwrap_or_else(|_| {
                Err(io_error(format!(
                    "{what} did not answer within {:?}",
                    self.connect_timeout
                )))
            })
    }

    async fn ask(&self, sentinel: &redis::Client) -> Result<(String, u16), RedisError> {
        let at = sentinel.get_connection_info().addr().to_string();
        let found: Option<(String, u16)> = self
            .bounded(&format!("sentinel {at}"), async {
                let mut conn = sentinel
                    .get_multiplexed_async_connection_with_config(&self.config)
                    .await?;
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&self.master_name)
                    .query_async(&mut conn)
                    .await
            })
            .await
            .map_err(|e| io_error(format!("sentinel {at}: {e}")))?;
        found.ok_or_else(|| {
            io_error(format!(
                "sentinel {at} knows no master named {:?}",
                self.master_name
            ))
        })
    }

    /// A connection to the master at `host`:`port` (`addr`, as logs name it), checked to be one.
    async fn connect_master(
        &self,
        host: String,
        port: u16,
        addr: &str,
    ) -> Result<MultiplexedConnection, RedisError> {
        let master = RedisNode {
            address: RedisAddress::Tcp { host, port },
            auth: self.master_auth.clone(),
            db: 0,
        };
        let client = client_with(&master, self.tls.as_ref(), &self.master_credentials)?;
        self.bounded(&format!("master {addr}"), async {
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&self.config)
                .await?;
            let role: Value = redis::cmd("ROLE").query_async(&mut conn).await?;
            let is_master = matches!(&role, Value::Array(parts)
                if matches!(parts.first(), Some(Value::BulkString(b)) if b == b"master"));
            if is_master {
                Ok(conn)
            } else {
                Err(io_error(format!(
                    "{addr}, named master by the sentinels, is not a master (yet)"
                )))
            }
        })
        .await
        .map_err(|e| io_error(format!("master {addr}: {e}")))
    }
}
