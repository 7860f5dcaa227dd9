//! One connection, from its TLS handshake to its close: served by hyper (HTTP/1 and HTTP/2, or
//! HTTP/2 only for gRPC), closed gracefully (a GOAWAY on HTTP/2) when it has been idle too
//! long, when it reaches its maximum age, or when the listener stops; forced closed when a
//! graceful close does not finish within its grace.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use super::accept::Io;
use super::guard::{ConnActivity, Guard, PortGuard, Served};
use super::{ConnectionAge, Limits};
use crate::telemetry::LogLimiter;

/// What every connection of one listener shares.
pub(super) struct ConnShared {
    pub builder: Builder<TokioExecutor>,
    pub tls: Option<TlsAcceptor>,
    pub limits: Limits,
    pub age: Option<ConnectionAge>,
    pub guard: Arc<PortGuard>,
    pub handshake_failures: LogLimiter,
}

/// Why a connection is being closed gracefully.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Closing {
    Idle,
    Age,
    Shutdown,
}

/// Serves one accepted connection until it closes. `permit` holds its slot under
/// SLUICE_MAX_CONNECTIONS; `stop` turns true when the listener stops.
pub(super) async fn serve<S: Served>(
    io: Io,
    permit: OwnedSemaphorePermit,
    shared: Arc<ConnShared>,
    service: S,
    mut stop: watch::Receiver<bool>,
) {
    let _permit = permit;
    let stats = &shared.guard.stats;
    stats.connections.fetch_add(1, Ordering::Relaxed);
    let _open = scopeguard(|| {
        stats.connections.fetch_sub(1, Ordering::Relaxed);
    });
    let Some(io) = handshake(io, &shared).await else {
        return;
    };
    let activity = Arc::new(ConnActivity::new());
    let guard = Guard {
        inner: service,
        port: shared.guard.clone(),
        conn: activity.clone(),
    };
    let conn = shared
        .builder
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(guard));
    tokio::pin!(conn);

    let limits = &shared.limits;
    let opened = Instant::now();
    let age_deadline = shared.age.map(|a| opened + a.max_age);
    let mut closing: Option<(Closing, Instant)> = None;
    loop {
        // The next moment something has to be checked: idleness, age, or a close's grace.
        let idle_check = match (closing, limits.idle_timeout) {
            (None, Some(idle)) => Some(match activity.idle_since() {
                Some(since) => since + idle,
                // A request in flight: look again one idle period from now.
                None => Instant::now() + idle,
            }),
            _ => None,
        };
        let grace_end = closing.and_then(|(why, since)| grace(why, &shared).map(|g| since + g));
        let age_check = age_deadline.filter(|_| closing.is_none());
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(port = shared.guard.port, error = %e, "connection ended with an error");
                }
                return;
            }
            changed = stop.changed(), if closing.is_none_or(|(why, _)| why != Closing::Shutdown) => {
                if changed.is_err() || *stop.borrow() {
                    conn.as_mut().graceful_shutdown();
                    closing = Some((Closing::Shutdown, Instant::now()));
                }
            }
            () = sleep_until_opt(idle_check) => {
                if activity.idle_since().is_some_and(|since| {
                    limits.idle_timeout.is_some_and(|idle| since.elapsed() >= idle)
                }) {
                    stats.idle_closed.fetch_add(1, Ordering::Relaxed);
                    conn.as_mut().graceful_shutdown();
                    closing = Some((Closing::Idle, Instant::now()));
                }
            }
            () = sleep_until_opt(age_check) => {
                conn.as_mut().graceful_shutdown();
                closing = Some((Closing::Age, Instant::now()));
            }
            () = sleep_until_opt(grace_end) => {
                tracing::debug!(port = shared.guard.port, "closing a connection whose graceful close outlasted its grace");
                return;
            }
        }
    }
}

/// How long a graceful close may take before the connection is dropped: an idle connection has
/// nothing in flight, so the same idle period again; an old one GRPC_MAX_CONNECTION_AGE_GRACE;
/// at shutdown the app's drain timeout bounds it instead.
fn grace(why: Closing, shared: &ConnShared) -> Option<Duration> {
    match why {
        Closing::Idle => shared.limits.idle_timeout,
        Closing::Age => shared.age.and_then(|a| a.grace),
        Closing::Shutdown => None,
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// The TLS handshake, when the listener has TLS, bounded by SLUICE_HEADER_TIMEOUT_MS: a client
/// that stalls it holds only its own connection, and only that long.
async fn handshake(io: Io, shared: &ConnShared) -> Option<Io> {
    let (Some(acceptor), Io::Tcp(tcp)) = (&shared.tls, &io) else {
        return Some(io);
    };
    let peer = tcp.peer_addr().ok();
    let Io::Tcp(tcp) = io else { unreachable!() };
    let timeout = shared.limits.header_read_timeout;
    let failure = match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => return Some(Io::Tls(Box::new(stream))),
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no handshake within {timeout:?} (SLUICE_HEADER_TIMEOUT_MS)"),
    };
    if let Some(suppressed) = shared.handshake_failures.check() {
        tracing::warn!(port = shared.guard.port, peer = ?peer, error = %failure, suppressed, "TLS handshake failed");
    }
    None
}

/// Runs `f` when dropped.
fn scopeguard<F: FnOnce()>(f: F) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

pub(super) fn builder(grpc_only: bool, limits: &Limits) -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    if grpc_only {
        builder = builder.http2_only();
    }
    builder
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        // hyper's floor for its read buffer is 8 KiB.
        .max_buf_size((limits.max_header_bytes as usize).max(8192))
        .keep_alive(true);
    let mut http2 = builder.http2();
    http2
        .timer(hyper_util::rt::TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_header_list_size(limits.max_header_bytes)
        .keep_alive_interval(limits.keepalive_interval);
    http2.keep_alive_timeout(limits.keepalive_timeout);
    builder
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopeguard_runs_once_on_drop() {
        let count = std::cell::Cell::new(0);
        {
            let _g = scopeguard(|| count.set(count.get() + 1));
        }
        assert_eq!(count.get(), 1);
    }
}
