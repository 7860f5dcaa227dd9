//! Every listener's serving loop, so that no client can cost Sluice more than a setting allows:
//! gRPC (GRPC_PORT or GRPC_UDS), HTTP (PORT), debug (DEBUG_PORT), Prometheus (PROMETHEUS_ADDR)
//! and peer (PEER_PORT) are all served here, with the same [`Limits`].
//!
//! - [`accept`]: the accept loop: a cap on open connections per listener, and a growing pause
//!   when accepting fails (out of descriptors), instead of a spin.
//! - [`mod@conn`]: one connection: the TLS handshake (bounded), hyper's HTTP/1 and HTTP/2 with
//!   bounded streams, header sizes and keep-alive pings, and its close when idle, old, or when
//!   the listener stops.
//! - [`guard`]: around every request: a cap on requests in flight, a deadline, and for gRPC each
//!   message's length checked from its prefix, before the decoder buffers it, against the
//!   message limit and a process-wide byte budget.
//!
//! What each bound costs at worst is in docs/hardening.md.

pub(crate) mod accept;
mod conn;
pub(crate) mod guard;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

pub(crate) use accept::Listener;
pub(crate) use guard::PortGuard;
pub use guard::{ByteBudget, Served};

use crate::telemetry::LogLimiter;

/// The limits every listener applies (the SLUICE_* listener settings).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// SLUICE_MAX_CONNECTIONS: open connections per listener; more wait in the kernel's backlog.
    pub max_connections: usize,
    /// SLUICE_MAX_CONCURRENT_STREAMS: HTTP/2 streams per connection (SETTINGS_MAX_CONCURRENT_STREAMS).
    pub max_concurrent_streams: u32,
    /// GRPC_MAX_CONCURRENT_STREAMS (envoyproxy/ratelimit's): the clients' gRPC listener's
    /// streams per connection instead ([`Limits::for_grpc_clients`]); `None` (Go's 0): as the
    /// others.
    pub grpc_max_concurrent_streams: Option<std::num::NonZeroU32>,
    /// SLUICE_MAX_INFLIGHT_REQUESTS: requests served at once per listener; more are refused at once.
    pub max_inflight_requests: usize,
    /// SLUICE_REQUEST_TIMEOUT_MS: a request's deadline, from its headers to its answer, body
    /// included (for gRPC, the client's `grpc-timeout` when shorter).
    pub request_timeout: Duration,
    /// SLUICE_HEADER_TIMEOUT_MS: time for a TLS handshake, and for an HTTP/1 request's head.
    pub header_read_timeout: Duration,
    /// SLUICE_IDLE_TIMEOUT_SECS: a connection with no request in flight for this long is closed
    /// (gracefully: a GOAWAY on HTTP/2). `None`: never.
    pub idle_timeout: Option<Duration>,
    /// SLUICE_KEEPALIVE_INTERVAL_SECS: HTTP/2 PINGs on a connection silent for this long.
    /// `None`: no pings.
    pub keepalive_interval: Option<Duration>,
    /// SLUICE_KEEPALIVE_TIMEOUT_SECS: a PING unanswered this long closes the connection.
    pub keepalive_timeout: Duration,
    /// SLUICE_MAX_HEADER_BYTES: an HTTP/1 request head, or an HTTP/2 header list.
    pub max_header_bytes: u32,
    /// SLUICE_MAX_PENDING_REQUEST_BYTES: gRPC message bytes being received at once, process-wide.
    pub max_pending_request_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 4096,
            max_concurrent_streams: 100,
            grpc_max_concurrent_streams: None,
            max_inflight_requests: 10_000,
            request_timeout: Duration::from_secs(5),
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Some(Duration::from_secs(300)),
            keepalive_interval: Some(Duration::from_secs(60)),
            keepalive_timeout: Duration::from_secs(20),
            max_header_bytes: 64 * 1024,
            max_pending_request_bytes: 64 * 1024 * 1024,
        }
    }
}

impl Limits {
    /// The limits of the clients' gRPC listener (GRPC_PORT or GRPC_UDS, not the peer port):
    /// GRPC_MAX_CONCURRENT_STREAMS, when set, as its streams per connection.
    pub(crate) fn for_grpc_clients(&self) -> Limits {
        Limits {
            max_concurrent_streams: self
                .grpc_max_concurrent_streams
                .map_or(self.max_concurrent_streams, std::num::NonZeroU32::get),
            ..self.clone()
        }
    }
}

/// Raises the soft limit on open descriptors to the hard limit, as the Go runtime does at
/// start-up, so the connection caps, not an inherited `ulimit -n` of 1024, decide how many
/// clients are served. Returns the limit in force (`None` if it cannot be read).
pub fn raise_descriptor_limit() -> Option<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let soft = limit.current?;
    if limit.maximum.is_none_or(|hard| hard > soft) {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            return Some(limit.maximum.unwrap_or(u64::MAX));
        }
    }
    Some(soft)
}

/// GRPC_MAX_CONNECTION_AGE and _GRACE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionAge {
    /// A connection this old is closed gracefully (a GOAWAY), so clients reconnect and spread
    /// over replicas added since.
    pub max_age: Duration,
    /// After the GOAWAY, how long calls in flight may take before the connection is cut;
    /// `None`: as long as they take.
    pub grace: Option<Duration>,
}

/// How a listener speaks, which decides how its refusals are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/2 only; refusals are gRPC statuses; message lengths are checked.
    Grpc,
    /// HTTP/1.1 and HTTP/2 (prior knowledge); refusals are HTTP statuses with a text body.
    Http,
}

/// One listener, ready to serve.
pub struct Port {
    name: &'static str,
    protocol: Protocol,
    limits: Limits,
    tls: Option<TlsAcceptor>,
    age: Option<ConnectionAge>,
    guard: Arc<PortGuard>,
}

impl Port {
    /// An HTTP listener (`name` is its setting, for logs: `PORT`, `DEBUG_PORT`, ...).
    pub fn http(name: &'static str, limits: &Limits) -> Self {
        Self::new(name, Protocol::Http, limits, None)
    }

    /// A gRPC listener whose messages may be up to `max_message_bytes` long, reserved from
    /// `budget` while they are received.
    pub fn grpc(
        name: &'static str,
        limits: &Limits,
        max_message_bytes: usize,
        budget: Arc<ByteBudget>,
    ) -> Self {
        Self::new(
            name,
            Protocol::Grpc,
            limits,
            Some((max_message_bytes, budget)),
        )
    }

    fn new(
        name: &'static str,
        protocol: Protocol,
        limits: &Limits,
        grpc: Option<(usize, Arc<ByteBudget>)>,
    ) -> Self {
        Port {
            name,
            protocol,
            limits: limits.clone(),
            tls: None,
            age: None,
            guard: Arc::new(PortGuard::new(
                name,
                protocol,
                limits.max_inflight_requests,
                limits.request_timeout,
                grpc,
            )),
        }
    }

    /// Serve TLS, with this acceptor's certificate and client verification.
    pub fn with_tls(mut self, tls: Option<TlsAcceptor>) -> Self {
        self.tls = tls;
        self
    }

    /// Close connections gracefully once they reach this age.
    pub(crate) fn with_age(mut self, age: Option<ConnectionAge>) -> Self {
        self.age = age;
        self
    }

    /// The listener's counters (requests in flight, refusals, open connections).
    pub fn guard(&self) -> Arc<PortGuard> {
        self.guard.clone()
    }

    /// Accepts and serves connections until `shutdown` completes; then stops accepting (the
    /// listening socket is closed), closes every connection gracefully and returns once they
    /// are all gone. Callers bound that wait (SLUICE_DRAIN_TIMEOUT_SECS).
    pub async fn serve<S: Served>(
        self,
        listener: impl Into<Listener>,
        service: S,
        shutdown: impl Future<Output = ()>,
    ) {
        let mut acceptor =
            accept::Acceptor::new(listener.into(), self.limits.max_connections, self.name);
        let shared = Arc::new(conn::ConnShared {
            builder: conn::builder(self.protocol == Protocol::Grpc, &self.limits),
            tls: self.tls,
            limits: self.limits,
            age: self.age,
            guard: self.guard,
            handshake_failures: LogLimiter::new(Duration::from_secs(10)),
        });
        // Every connection holds a receiver; once they are all dropped, `closed` completes.
        let (stop_tx, stop_rx) = watch::channel(false);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                (io, permit) = acceptor.next() => {
                    tokio::spawn(conn::serve(io, permit, shared.clone(), service.clone(), stop_rx.clone()));
                }
            }
        }
        drop(acceptor);
        let _ = stop_tx.send(true);
        drop(stop_rx);
        stop_tx.closed().await;
    }
}
