//! Accepting connections: a bound listener (TCP or a unix socket), a cap on open connections,
//! and a back-off when the process runs out of descriptors, so a full descriptor table costs
//! a few wake-ups a second instead of a spinning core.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::telemetry::LogLimiter;

/// The first pause after a failed `accept`; it doubles up to [`MAX_BACKOFF`] while accepting
/// keeps failing, and starts again after a success.
const MIN_BACKOFF: Duration = Duration::from_millis(5);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// A bound listener.
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl From<TcpListener> for Listener {
    fn from(listener: TcpListener) -> Self {
        Listener::Tcp(listener)
    }
}

impl From<UnixListener> for Listener {
    fn from(listener: UnixListener) -> Self {
        Listener::Unix(listener)
    }
}

impl Listener {
    async fn accept(&self) -> io::Result<Io> {
        match self {
            Listener::Tcp(l) => {
                let (stream, _) = l.accept().await?;
                // Without TCP_NODELAY a response's last bytes (gRPC trailers) can wait for the
                // client's delayed ACK, up to 40 ms, whenever the previous write is unacknowledged.
                let _ = stream.set_nodelay(true);
                Ok(Io::Tcp(stream))
            }
            Listener::Unix(l) => Ok(Io::Unix(l.accept().await?.0)),
        }
    }
}

/// An accepted connection's byte stream: plain TCP, a unix socket, or TLS over TCP.
pub(crate) enum Io {
    Tcp(TcpStream),
    Unix(UnixStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Io::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Io::Unix(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Tcp(s) => s.is_write_vectored(),
            Io::Unix(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_flush(cx),
            Io::Unix(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Io::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Hands out accepted connections, at most `max_connections` open at once: each comes with a
/// permit that frees its slot when the connection is dropped. At the cap the loop stops
/// accepting, so new clients wait in the kernel's backlog (and are refused by the kernel once
/// it is full) rather than costing a descriptor each.
pub(crate) struct Acceptor {
    listener: Listener,
    slots: Arc<Semaphore>,
    max_connections: usize,
    /// Which listener, for log lines: `GRPC_PORT`, `PORT`, ...
    port: &'static str,
    backoff: Duration,
    errors: LogLimiter,
    at_cap: LogLimiter,
}

impl Acceptor {
    pub(crate) fn new(listener: Listener, max_connections: usize, port: &'static str) -> Self {
        Acceptor {
            listener,
            slots: Arc::new(Semaphore::new(max_connections)),
            max_connections,
            port,
            backoff: MIN_BACKOFF,
            errors: LogLimiter::new(Duration::from_secs(10)),
            at_cap: LogLimiter::new(Duration::from_secs(60)),
        }
    }

    /// The next connection and its slot. Never fails: errors are logged (at most one line per
    /// ten seconds) and retried after a pause that grows while they last.
    pub(crate) async fn next(&mut self) -> (Io, OwnedSemaphorePermit) {
        let permit = match self.slots.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                if let Some(suppressed) = self.at_cap.check() {
                    tracing::warn!(
                        port = self.port,
                        max = self.max_connections,
                        suppressed,
                        "connection cap reached (SLUICE_MAX_CONNECTIONS); new connections wait until one closes"
                    );
                }
                // The semaphore is never closed, so this cannot fail.
                self.slots
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("the connection semaphore is never closed")
            }
        };
        loop {
            match self.listener.accept().await {
                Ok(io) => {
                    self.backoff = MIN_BACKOFF;
                    return (io, permit);
                }
                // The client gave up between SYN and accept: nothing to wait for.
                Err(e) if is_per_connection(&e) => continue,
                Err(e) => {
                    // Out of descriptors (EMFILE, ENFILE) or memory (ENOBUFS, ENOMEM): the
                    // pending connection stays in the backlog and accept would fail again at
                    // once, so wait for other connections to close.
                    if let Some(suppressed) = self.errors.check() {
                        tracing::warn!(port = self.port, error = %e, retry_in = ?self.backoff, suppressed, "accept failed");
                    }
                    tokio::time::sleep(self.backoff).await;
                    self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }
}

/// Errors that concern one connection only; the next accept can succeed at once.
fn is_per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_connection_slot_is_freed_when_its_permit_drops() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut acceptor = Acceptor::new(listener.into(), 1, "test");
        let _c1 = TcpStream::connect(addr).await.unwrap();
        let _c2 = TcpStream::connect(addr).await.unwrap();
        let (first, permit) = acceptor.next().await;
        // At the cap: the second connection is not accepted while the first holds its slot.
        let waiting = tokio::time::timeout(Duration::from_millis(200), acceptor.next()).await;
        assert!(
            waiting.is_err(),
            "a second connection was accepted past the cap"
        );
        drop((first, permit));
        let second = tokio::time::timeout(Duration::from_secs(10), acceptor.next()).await;
        assert!(second.is_ok(), "the freed slot was not reused");
    }
}
