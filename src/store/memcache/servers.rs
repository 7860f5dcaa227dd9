//! The memcached servers: each with its connections and a breaker, and the list that spreads
//! keys over them as the Go service's client (gomemcache) does: the CRC-32 (IEEE) of the key,
//! modulo the number of servers, indexes the list in its given order. So a Go instance and
//! Sluice given the same MEMCACHE_HOST_PORT (or SRV records) put every key on the same server.
//!
//! **Connections.** Each server has MEMCACHE_MAX_IDLE_CONNS connections (2 by default), made on
//! first use and kept; calls take them in turn. memcached answers a connection's commands in the
//! order they came, so one connection carries many calls at once: a writer task writes each
//! call's commands as they arrive (the calls that queued meanwhile in one write), and a reader
//! task reads the replies in order and hands each call its own. At most
//! SLUICE_MEMCACHE_MAX_PENDING calls per server are in flight (a call waits for room within its
//! deadline); a call that gives up leaves its commands to be answered and its replies dropped.
//! gomemcache instead opens a connection per concurrent call and closes all but the idle ones
//! afterwards, which under load spends more on connecting than on counting.
//!
//! A connection that fails (refused, reset, closed by memcached, a reply out of protocol) fails
//! every call waiting on it and is replaced at the next call; the reader watches an idle
//! connection too, so one memcached closed (it restarted) is replaced before a call trips on it.
//!
//! **Failures** are the Redis breaker's ([`super::super::breaker`]), per server: a refused or
//! broken connection opens it, SLUICE_MEMCACHE_BREAKER_TIMEOUTS calls in a row without an answer
//! open it, and while it is open that server's calls fail at once and its connections are
//! closed; a probe (a new connection and `version`, within max(timeout, 1 s)) every
//! SLUICE_MEMCACHE_PROBE_INTERVAL_MS closes it when memcached answers again. The other servers'
//! keys are unaffected.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use super::protocol::{Batch, CallError, Reply};
use crate::store::StoreError;
use crate::store::breaker::{Breaker, BreakerSettings, BreakerStats, Kind, Readiness};

const MEMCACHED: Kind = Kind {
    noun: "memcached",
    probe_var: "SLUICE_MEMCACHE_PROBE_INTERVAL_MS",
};

/// Calls written to a connection in one write at most.
const MAX_CALLS_PER_WRITE: usize = 64;

/// How every server's connections behave.
pub(crate) struct Options {
    /// SLUICE_MEMCACHE_TIMEOUT_MS: the deadline of a whole call.
    pub timeout: Duration,
    /// MEMCACHE_MAX_IDLE_CONNS: the connections kept per server.
    pub conns: usize,
    /// SLUICE_MEMCACHE_MAX_PENDING: calls in flight per server.
    pub max_pending: usize,
    pub breaker: BreakerSettings,
    /// MEMCACHE_TLS's connector.
    pub tls: Option<tokio_rustls::TlsConnector>,
}

impl Options {
    fn connect_timeout(&self) -> Duration {
        self.timeout.max(Duration::from_secs(1))
    }
}

trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// One call on a connection: its commands, where its replies go, and its room among the
/// server's calls in flight (given back once it is answered or its connection fails).
struct Job {
    batch: Batch,
    reply: oneshot::Sender<Result<Vec<Reply>, CallError>>,
    _room: OwnedSemaphorePermit,
}

fn closed(cause: &str) -> CallError {
    CallError::Io(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        cause.to_owned(),
    ))
}

/// One connection, shared by the calls in flight on it.
struct Conn {
    jobs: mpsc::UnboundedSender<Job>,
    broken: Arc<AtomicBool>,
    tasks: [tokio::task::JoinHandle<()>; 2],
}

impl Drop for Conn {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Conn {
    fn start(io: Box<dyn Io>) -> Self {
        let (read, write) = tokio::io::split(io);
        let (jobs, queued) = mpsc::unbounded_channel();
        let (written, pending) = mpsc::unbounded_channel();
        let broken = Arc::new(AtomicBool::new(false));
        let tasks = [
            tokio::spawn(write_jobs(write, queued, written, broken.clone())),
            tokio::spawn(read_replies(BufReader::new(read), pending, broken.clone())),
        ];
        Conn {
            jobs,
            broken,
            tasks,
        }
    }

    fn is_usable(&self) -> bool {
        !self.broken.load(Ordering::Acquire) && !self.jobs.is_closed()
    }

    /// Sends `batch`'s commands and waits for its replies; `room` is given back with them.
    async fn call(
        &self,
        batch: Batch,
        room: OwnedSemaphorePermit,
    ) -> Result<Vec<Reply>, CallError> {
        let gone = || closed("the connection to memcached closed");
        let (reply, answer) = oneshot::channel();
        let job = Job {
            batch,
            reply,
            _room: room,
        };
        self.jobs.send(job).map_err(|_| gone())?;
        answer.await.unwrap_or_else(|_| Err(gone()))
    }
}

/// The writer: the calls that queued meanwhile, handed to the reader first (so it expects
/// their replies before any can arrive) and their commands then written in one go.
async fn write_jobs(
    mut out: tokio::io::WriteHalf<Box<dyn Io>>,
    mut queued: mpsc::UnboundedReceiver<Job>,
    written: mpsc::UnboundedSender<Job>,
    broken: Arc<AtomicBool>,
) {
    let mut jobs = Vec::with_capacity(MAX_CALLS_PER_WRITE);
    let mut bytes = Vec::new();
    while queued.recv_many(&mut jobs, MAX_CALLS_PER_WRITE).await > 0 {
        bytes.clear();
        for job in jobs.drain(..) {
            bytes.extend_from_slice(job.batch.bytes());
            if let Err(mpsc::error::SendError(job)) = written.send(job) {
                let _ = job
                    .reply
                    .send(Err(closed("the connection to memcached closed")));
            }
        }
        let wrote = async {
            out.write_all(&bytes).await?;
            out.flush().await
        };
        if wrote.await.is_err() {
            // The reader fails the calls it holds when the connection's end reaches it, or
            // they are dropped with the connection; either way it is not used again.
            broken.store(true, Ordering::Release);
            return;
        }
    }
}

/// The reader: each written call's replies, in order. While no call waits, bytes or an end
/// from memcached mean the connection is over.
async fn read_replies(
    mut input: BufReader<tokio::io::ReadHalf<Box<dyn Io>>>,
    mut pending: mpsc::UnboundedReceiver<Job>,
    broken: Arc<AtomicBool>,
) {
    let cause = loop {
        let job = tokio::select! {
            biased;
            job = pending.recv() => match job {
                Some(job) => job,
                None => return,
            },
            idle = input.fill_buf() => break match idle {
                Ok([]) => "memcached closed the connection".to_owned(),
                Ok(_) => "memcached sent bytes no command asked for".to_owned(),
                Err(e) => e.to_string(),
            },
        };
        match job.batch.read_replies(&mut input).await {
            Ok(replies) => {
                let _ = job.reply.send(Ok(replies));
            }
            Err(e) => {
                let cause = e.to_string();
                let _ = job.reply.send(Err(e));
                break cause;
            }
        }
    };
    broken.store(true, Ordering::Release);
    pending.close();
    while let Ok(job) = pending.try_recv() {
        let _ = job.reply.send(Err(closed(&cause)));
    }
}

/// One of a server's connections: made on first use, replaced when broken.
#[derive(Default)]
struct Slot {
    conn: ArcSwapOption<Conn>,
    connecting: tokio::sync::Mutex<()>,
}

/// One memcached server.
pub(crate) struct Server {
    /// As configured: `host:port` (an SRV record's `target.:port`) or a socket path.
    pub addr: String,
    breaker: Breaker,
    slots: Box<[Slot]>,
    turn: AtomicUsize,
    room: Arc<Semaphore>,
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
            slots: (0..options.conns.max(1)).map(|_| Slot::default()).collect(),
            turn: AtomicUsize::new(0),
            room: Arc::new(Semaphore::new(options.max_pending)),
            options: options.clone(),
        })
    }

    pub(crate) fn stats(&self) -> BreakerStats {
        self.breaker.stats()
    }

    /// A new connection: TCP (with TCP_NODELAY) or a Unix socket for an address with a `/`,
    /// then TLS if set.
    async fn connect(&self) -> Result<Box<dyn Io>, CallError> {
        if self.addr.contains('/') {
            return Ok(Box::new(tokio::net::UnixStream::connect(&self.addr).await?));
        }
        let (host, port) = split_host_port(&self.addr)
            .ok_or_else(|| CallError::Protocol(format!("{} is not host:port", self.addr)))?;
        let tcp = tokio::net::TcpStream::connect((host, port)).await?;
        tcp.set_nodelay(true)?;
        Ok(match &self.options.tls {
            None => Box::new(tcp),
            Some(connector) => {
                let name = rustls::pki_types::ServerName::try_from(host.to_owned())
                    .map_err(|e| CallError::Protocol(format!("{host}: {e}")))?;
                Box::new(connector.connect(name, tcp).await?)
            }
        })
    }

    /// The next connection in turn, made if it is missing or broken.
    async fn conn(&self) -> Result<Arc<Conn>, CallError> {
        let slot = &self.slots[self.turn.fetch_add(1, Ordering::Relaxed) % self.slots.len()];
        if let Some(c) = slot.conn.load_full().filter(|c| c.is_usable()) {
            return Ok(c);
        }
        let _one_at_a_time = slot.connecting.lock().await;
        if let Some(c) = slot.conn.load_full().filter(|c| c.is_usable()) {
            return Ok(c);
        }
        let c = Arc::new(Conn::start(self.connect().await?));
        slot.conn.store(Some(c.clone()));
        Ok(c)
    }

    /// Closes every connection (the breaker opened: they are from before the outage).
    fn close_all(&self) {
        for slot in &self.slots {
            slot.conn.store(None);
        }
    }

    /// Sends `batch` and reads its replies, by `deadline`; fails at once while the breaker is
    /// open.
    pub(crate) async fn call(
        &self,
        batch: Batch,
        deadline: Instant,
    ) -> Result<Vec<Reply>, StoreError> {
        if self.breaker.first_attempt_pending() {
            let _ = tokio::time::timeout_at(deadline, self.breaker.first_attempt()).await;
        }
        self.breaker.check()?;
        let room = self.room.clone().acquire_owned();
        let Ok(Ok(room)) = tokio::time::timeout_at(deadline, room).await else {
            return Err(backend(format!(
                "{} calls to memcached {} (SLUICE_MEMCACHE_MAX_PENDING) were in flight for {:?}",
                self.options.max_pending, self.addr, self.options.timeout
            )));
        };
        let attempt = async { self.conn().await?.call(batch, room).await };
        match tokio::time::timeout_at(deadline, attempt).await {
            Ok(Ok(replies)) => {
                self.breaker.answered();
                Ok(replies)
            }
            Ok(Err(e @ CallError::Server(_))) => {
                self.breaker.answered();
                Err(backend(format!("memcached {}: {e}", self.addr)))
            }
            Ok(Err(e)) => {
                let message = format!("memcached {}: {e}", self.addr);
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

    /// A new connection answers `version`: it becomes the first connection (the others are
    /// closed: they are from before the outage) and the breaker closes.
    async fn check(&self) -> Result<(), String> {
        let limit = self.options.connect_timeout();
        let checked = tokio::time::timeout(limit, async {
            let conn = Conn::start(self.connect().await?);
            let mut batch = Batch::default();
            batch.version();
            let room = self.room.clone().acquire_owned().await;
            let room = room.map_err(|_| closed("the server was removed"))?;
            conn.call(batch, room).await?;
            Ok::<_, CallError>(conn)
        })
        .await;
        match checked {
            Ok(Ok(conn)) => {
                self.close_all();
                self.slots[0].conn.store(Some(Arc::new(conn)));
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
            self.close_all();
        }
    }
}

/// `host:port`, `[v6]:port`, or an SRV record's `target.:port` (the dot is dropped: the
/// system's resolver does not find `localhost.` in /etc/hosts).
pub(crate) fn split_host_port(addr: &str) -> Option<(&str, u16)> {
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
pub(crate) struct ServerList {
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
    pub(crate) fn start(addrs: Vec<String>, options: Options) -> Arc<Self> {
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
    pub(crate) fn set(&self, addrs: Vec<String>, first: bool) {
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
    pub(crate) fn pick(&self, key: &str) -> Result<Arc<Server>, StoreError> {
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

    pub(crate) fn servers(&self) -> Arc<Vec<Arc<Server>>> {
        self.servers.load_full()
    }

    pub(crate) fn is_ready(&self) -> bool {
        self.readiness.is_ready()
    }

    pub(crate) fn ready_changes(&self) -> tokio::sync::watch::Receiver<bool> {
        self.readiness.subscribe()
    }

    pub(crate) fn timeout(&self) -> Duration {
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
            conns: 2,
            max_pending: 4,
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
