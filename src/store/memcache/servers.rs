//! The memcached servers: each with a pool of connections and a breaker, and the list that
//! spreads keys over them as the Go service's client (gomemcache) does: the CRC-32 (IEEE) of
//! the key, modulo the number of servers, indexes the list in its given order. So a Go instance
//! and Sluice given the same MEMCACHE_HOST_PORT (or SRV records) put every key on the same
//! server.
//!
//! **Connections.** A call takes an idle connection or opens one (at most
//! SLUICE_MEMCACHE_MAX_CONNS per server at once; a call waits for one within its deadline),
//! writes its commands in one go and reads the replies in order. Afterwards the connection is
//! kept idle if fewer than MEMCACHE_MAX_IDLE_CONNS are, else closed, as gomemcache does. A
//! connection that failed, timed out or got an error reply is closed, never reused. A call
//! whose idle connection turns out closed (memcached restarted) is retried once on a new one.
//!
//! **Failures** are the Redis breaker's ([`super::super::breaker`]), per server: a refused or
//! broken connection opens it, SLUICE_MEMCACHE_BREAKER_TIMEOUTS calls in a row without an answer
//! open it, and while it is open that server's calls fail at once; a probe (a new connection
//! and `version`, within max(timeout, 1 s)) every SLUICE_MEMCACHE_PROBE_INTERVAL_MS closes it
//! when memcached answers again. The other servers' keys are unaffected.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::protocol::{Batch, CallError, Reply};
use crate::store::StoreError;
use crate::store::breaker::{Breaker, BreakerSettings, BreakerStats, Kind, Readiness};

const MEMCACHED: Kind = Kind {
    noun: "memcached",
    probe_var: "SLUICE_MEMCACHE_PROBE_INTERVAL_MS",
};

/// How every server's connections behave.
pub struct Options {
    /// SLUICE_MEMCACHE_TIMEOUT_MS: the deadline of a whole call.
    pub timeout: Duration,
    /// MEMCACHE_MAX_IDLE_CONNS.
    pub max_idle: usize,
    /// SLUICE_MEMCACHE_MAX_CONNS.
    pub max_conns: usize,
    pub breaker: BreakerSettings,
    /// MEMCACHE_TLS: the connector and whether the name is checked.
    pub tls: Option<tokio_rustls::TlsConnector>,
}

impl Options {
    fn connect_timeout(&self) -> Duration {
        self.timeout.max(Duration::from_secs(1))
    }
}

trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

struct Conn {
    io: BufStream<Box<dyn Io>>,
}

impl Conn {
    async fn call(&mut self, batch: &Batch) -> Result<Vec<Reply>, CallError> {
        self.io.write_all(batch.bytes()).await?;
        self.io.flush().await?;
        batch.read_replies(&mut self.io).await
    }
}

/// One memcached server.
pub struct Server {
    /// As configured: `host:port` (an SRV record's `target.:port`) or a socket path.
    pub addr: String,
    breaker: Breaker,
    idle: Mutex<Vec<Conn>>,
    permits: Semaphore,
    options: Arc<Options>,
}

fn backend(message: String) -> StoreError {
    StoreError::Backend { message }
}

impl Server {
    fn new(addr: String, options: &Arc<Options>, readiness: Arc<Readiness>) -> Arc<Self> {
        Arc::new(Server {
            breaker: Breaker::new(
                MEMCACHED,
                "memcache",
                addr.clone(),
                options.breaker,
                readiness,
            ),
            addr,
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(options.max_conns),
            options: options.clone(),
        })
    }

    pub fn stats(&self) -> BreakerStats {
        self.breaker.stats()
    }

    pub fn is_up(&self) -> bool {
        self.breaker.is_up()
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Conn>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new connection: TCP (with TCP_NODELAY) or a Unix socket for an address with a `/`,
    /// then TLS if set.
    async fn connect(&self) -> Result<Conn, CallError> {
        let io: Box<dyn Io> = if self.addr.contains('/') {
            Box::new(tokio::net::UnixStream::connect(&self.addr).await?)
        } else {
            let (host, port) = split_host_port(&self.addr)
                .ok_or_else(|| CallError::Protocol(format!("{} is not host:port", self.addr)))?;
            let tcp = tokio::net::TcpStream::connect((host, port)).await?;
            tcp.set_nodelay(true)?;
            match &self.options.tls {
                None => Box::new(tcp),
                Some(connector) => {
                    let name = rustls::pki_types::ServerName::try_from(host.to_owned())
                        .map_err(|e| CallError::Protocol(format!("{host}: {e}")))?;
                    Box::new(connector.connect(name, tcp).await?)
                }
            }
        };
        Ok(Conn {
            io: BufStream::new(io),
        })
    }

    /// Sends `batch` and reads its replies, by `deadline`; fails at once while the breaker is
    /// open.
    pub async fn call(&self, batch: &Batch, deadline: Instant) -> Result<Vec<Reply>, StoreError> {
        if self.breaker.first_attempt_pending() {
            let _ = tokio::time::timeout_at(deadline, self.breaker.first_attempt()).await;
        }
        self.breaker.check()?;
        let Ok(Ok(_permit)) = tokio::time::timeout_at(deadline, self.permits.acquire()).await
        else {
            return Err(backend(format!(
                "all {} connections to memcached {} (SLUICE_MEMCACHE_MAX_CONNS) stayed busy \
                 for {:?}",
                self.options.max_conns, self.addr, self.options.timeout
            )));
        };
        let attempt = async {
            let pooled = self.idle().pop();
            let reused = pooled.is_some();
            let mut conn = match pooled {
                Some(c) => c,
                None => self.connect().await?,
            };
            match conn.call(batch).await {
                // An idle connection memcached closed (it restarted): once more on a new one.
                Err(CallError::Io(_)) if reused => {
                    conn = self.connect().await?;
                    let replies = conn.call(batch).await?;
                    Ok((conn, replies))
                }
                other => other.map(|replies| (conn, replies)),
            }
        };
        match tokio::time::timeout_at(deadline, attempt).await {
            Ok(Ok((conn, replies))) => {
                self.breaker.answered();
                let mut idle = self.idle();
                if idle.len() < self.options.max_idle {
                    idle.push(conn);
                }
                Ok(replies)
            }
            Ok(Err(e @ CallError::Server(_))) => {
                self.breaker.answered();
                Err(backend(format!("memcached {}: {e}", self.addr)))
            }
            Ok(Err(e)) => {
                let message = format!("memcached {}: {e}", self.addr);
                self.idle().clear();
                self.breaker.connection_failed(message.clone());
                Err(backend(message))
            }
            Err(_) => {
                let message = format!(
                    "memcached {} did not answer within {:?} (SLUICE_MEMCACHE_TIMEOUT_MS)",
                    self.addr, self.options.timeout
                );
                self.breaker.timed_out(&message);
                Err(backend(message))
            }
        }
    }

    /// A new connection answers `version`: it becomes an idle connection (the old ones are
    /// closed: they are from before the outage) and the breaker closes.
    async fn check(&self) -> Result<(), String> {
        let limit = self.options.connect_timeout();
        let checked = tokio::time::timeout(limit, async {
            let mut conn = self.connect().await?;
            let mut batch = Batch::default();
            batch.version();
            conn.call(&batch).await?;
            Ok::<_, CallError>(conn)
        })
        .await;
        match checked {
            Ok(Ok(conn)) => {
                let mut idle = self.idle();
                idle.clear();
                if self.options.max_idle > 0 {
                    idle.push(conn);
                }
                drop(idle);
                self.breaker.close();
                Ok(())
            }
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {limit:?}")),
        }
    }

    /// Checks until memcached first answers, then probes whenever the breaker opens.
    async fn supervise(self: Arc<Self>) {
        loop {
            loop {
                match self.check().await {
                    Ok(()) => break,
                    Err(e) => {
                        tracing::warn!(memcached = %self.addr, error = %e, "memcached not answering");
                        self.breaker.still_down(e);
                    }
                }
                tokio::time::sleep(self.options.breaker.probe_interval).await;
            }
            self.breaker.wait_open().await;
            self.idle().clear();
        }
    }
}

/// `host:port`, `[v6]:port`, or an SRV record's `target.:port` (the dot is dropped: the
/// system's resolver does not find `localhost.` in /etc/hosts).
pub fn split_host_port(addr: &str) -> Option<(&str, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let host = host.strip_suffix('.').unwrap_or(host);
    let port = port.parse().ok().filter(|p| *p != 0)?;
    (!host.is_empty()).then_some((host, port))
}

/// The servers in use, in the order that spreads keys, and their supervisors.
pub struct ServerList {
    servers: ArcSwap<Vec<Arc<Server>>>,
    tasks: Mutex<HashMap<String, tokio::task::JoinHandle<()>>>,
    options: Arc<Options>,
    /// Ready once every server of the first list has answered.
    readiness: Arc<Readiness>,
}

impl Drop for ServerList {
    fn drop(&mut self) {
        for (_, task) in self
            .tasks
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
        {
            task.abort();
        }
    }
}

impl ServerList {
    /// Starts a supervisor for each of `addrs`. Must be called inside a tokio runtime.
    pub fn start(addrs: Vec<String>, options: Options) -> Arc<Self> {
        let options = Arc::new(options);
        let distinct = addrs.iter().collect::<std::collections::HashSet<_>>().len();
        let readiness = Readiness::new(distinct, options.breaker.health_follows_connection);
        let list = Arc::new(ServerList {
            servers: ArcSwap::from_pointee(Vec::new()),
            tasks: Mutex::new(HashMap::new()),
            options,
            readiness,
        });
        list.set(addrs, true);
        list
    }

    /// Installs a new list (an SRV refresh): servers still named keep their connections and
    /// breakers, new ones get a supervisor, the others are stopped. Servers added after the
    /// first list do not hold back readiness: a new memcached that is not up yet must not take
    /// every Sluice out of service.
    pub fn set(&self, addrs: Vec<String>, first: bool) {
        let current = self.servers.load_full();
        if !first && current.iter().map(|s| &s.addr).eq(addrs.iter()) {
            return;
        }
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        let mut next: Vec<Arc<Server>> = Vec::with_capacity(addrs.len());
        for addr in addrs {
            // A server named twice is one server in two places, as in gomemcache's list.
            let known = current
                .iter()
                .chain(&next)
                .find(|s| s.addr == addr)
                .cloned();
            if let Some(s) = known {
                next.push(s);
                continue;
            }
            let readiness = if first {
                self.readiness.clone()
            } else {
                Readiness::new(1, false)
            };
            let server = Server::new(addr.clone(), &self.options, readiness);
            tasks.insert(addr, tokio::spawn(server.clone().supervise()));
            next.push(server);
        }
        for gone in current
            .iter()
            .filter(|s| !next.iter().any(|n| n.addr == s.addr))
        {
            if let Some(task) = tasks.remove(&gone.addr) {
                task.abort();
            }
            gone.breaker.leave();
        }
        if !first {
            tracing::info!(servers = ?next.iter().map(|s| &s.addr).collect::<Vec<_>>(), "memcached servers changed");
        }
        self.servers.store(Arc::new(next));
    }

    /// The server `key` goes to: gomemcache's `crc32.ChecksumIEEE(key) % len`.
    pub fn pick(&self, key: &str) -> Result<Arc<Server>, StoreError> {
        let servers = self.servers.load();
        let n = servers.len();
        if n == 0 {
            return Err(backend(
                "no memcached servers (the SRV records name none)".into(),
            ));
        }
        let i = if n == 1 {
            0
        } else {
            crc32fast::hash(key.as_bytes()) as usize % n
        };
        Ok(servers[i].clone())
    }

    pub fn servers(&self) -> Arc<Vec<Arc<Server>>> {
        self.servers.load_full()
    }

    pub fn is_ready(&self) -> bool {
        self.readiness.is_ready()
    }

    pub fn ready_changes(&self) -> tokio::sync::watch::Receiver<bool> {
        self.readiness.subscribe()
    }

    pub fn timeout(&self) -> Duration {
        self.options.timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_split_into_host_and_port() {
        assert_eq!(
            split_host_port("127.0.0.1:11211"),
            Some(("127.0.0.1", 11211))
        );
        assert_eq!(split_host_port("[::1]:11211"), Some(("::1", 11211)));
        assert_eq!(
            split_host_port("memcached-0.memcached.default.svc.cluster.local.:11211"),
            Some(("memcached-0.memcached.default.svc.cluster.local", 11211))
        );
        assert_eq!(split_host_port("memcached"), None);
        assert_eq!(split_host_port(":11211"), None);
        assert_eq!(split_host_port("m:0"), None);
        assert_eq!(split_host_port("m:x"), None);
    }

    #[tokio::test]
    async fn keys_spread_as_gomemcache_spreads_them() {
        let options = Options {
            timeout: Duration::from_millis(100),
            max_idle: 2,
            max_conns: 4,
            breaker: BreakerSettings::default(),
            tls: None,
        };
        let addrs: Vec<String> = (1..=3).map(|i| format!("127.0.0.1:{i}")).collect();
        let list = ServerList::start(addrs, options);
        // crc32.ChecksumIEEE("domain_key_value_1700000000") is 0xd5a097d1 (Go's hash/crc32,
        // zlib's and Python's agree), 3584071633 % 3 == 1: the second server.
        assert_eq!(crc32fast::hash(b"domain_key_value_1700000000"), 0xd5a0_97d1);
        assert_eq!(
            list.pick("domain_key_value_1700000000").unwrap().addr,
            "127.0.0.1:2"
        );
        // A server named twice keeps its two places in the distribution, as one server.
        list.set(
            vec![
                "127.0.0.1:1".into(),
                "127.0.0.1:1".into(),
                "127.0.0.1:3".into(),
            ],
            false,
        );
        let servers = list.servers();
        assert!(Arc::ptr_eq(&servers[0], &servers[1]));
        assert_eq!(servers.len(), 3);
        // One server takes every key without hashing.
        list.set(vec!["127.0.0.1:9".into()], false);
        assert_eq!(list.pick("anything").unwrap().addr, "127.0.0.1:9");
        list.set(Vec::new(), false);
        assert!(list.pick("k").is_err());
    }
}
