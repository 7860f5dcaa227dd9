//! The guard around every request a listener serves: a cap on requests in flight, a deadline,
//! and for gRPC a check of each message's length prefix before the decoder sees it.
//!
//! tonic reserves a buffer of the announced message length as soon as it has read a message's
//! 5-byte prefix, so without this check five bytes make it allocate up to its decoding limit.
//! Here the prefix is read first: a message longer than the port's limit fails the call with
//! INVALID_ARGUMENT before anything is buffered, and the announced bytes are reserved from a
//! process-wide budget ([`ByteBudget`]), so all the calls being received at once cannot hold
//! more than it, however many connections and streams carry them.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::Protocol;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body a guarded service answers with: the inner service's, or the guard's own refusal.
pub(crate) type GuardedResponse<B> = Response<Tracked<Either<B, Full<Bytes>>>>;

/// Bytes of gRPC messages being received at once, over every connection of every gRPC
/// listener (SLUICE_MAX_PENDING_REQUEST_BYTES).
#[derive(Debug)]
pub struct ByteBudget {
    semaphore: Arc<Semaphore>,
    max: usize,
}

impl ByteBudget {
    pub fn new(max: usize) -> Arc<Self> {
        // The semaphore's own ceiling is far above any sensible budget.
        let max = max.min(Semaphore::MAX_PERMITS);
        Arc::new(ByteBudget {
            semaphore: Arc::new(Semaphore::new(max)),
            max,
        })
    }

    /// Bytes reserved right now.
    pub(crate) fn in_use(&self) -> usize {
        self.max - self.semaphore.available_permits()
    }

    /// Reserves `bytes` until the permit is dropped; `None` when fewer are left.
    pub(crate) fn try_reserve(&self, bytes: u32) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.semaphore.clone().try_acquire_many_owned(bytes).ok()
    }
}

/// What the guard enforces on one listener, and its counters.
#[derive(Debug)]
pub struct PortGuard {
    /// The listener's setting, for logs and metrics: `GRPC_PORT`, `PORT`, ...
    pub port: &'static str,
    pub(super) protocol: Protocol,
    max_inflight: usize,
    request_timeout: Duration,
    /// gRPC only: the longest message accepted, and the budget it is reserved from.
    grpc: Option<(usize, Arc<ByteBudget>)>,
    inflight: AtomicUsize,
    pub stats: PortStats,
}

/// What one listener refused, for `/metrics`.
#[derive(Debug, Default)]
pub struct PortStats {
    pub connections: AtomicUsize,
    pub refused_inflight: AtomicU64,
    pub deadline_exceeded: AtomicU64,
    pub refused_message_size: AtomicU64,
    pub refused_budget: AtomicU64,
    pub idle_closed: AtomicU64,
}

impl PortGuard {
    pub(super) fn new(
        port: &'static str,
        protocol: Protocol,
        max_inflight: usize,
        request_timeout: Duration,
        grpc: Option<(usize, Arc<ByteBudget>)>,
    ) -> Self {
        PortGuard {
            port,
            protocol,
            max_inflight,
            request_timeout,
            grpc,
            inflight: AtomicUsize::new(0),
            stats: PortStats::default(),
        }
    }

    /// Requests being served right now.
    pub fn inflight(&self) -> usize {
        self.inflight.load(Ordering::Relaxed)
    }
}

/// One connection's activity, for its idle timeout.
#[derive(Debug)]
pub(super) struct ConnActivity {
    start: Instant,
    inflight: AtomicUsize,
    /// Milliseconds since `start` when the last request finished (or the connection opened).
    last_done_ms: AtomicU64,
}

impl ConnActivity {
    pub(super) fn new() -> Self {
        ConnActivity {
            start: Instant::now(),
            inflight: AtomicUsize::new(0),
            last_done_ms: AtomicU64::new(0),
        }
    }

    /// When the connection became idle, or `None` while a request is in flight.
    pub(super) fn idle_since(&self) -> Option<Instant> {
        if self.inflight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let ms = self.last_done_ms.load(Ordering::Acquire);
        Some(self.start + Duration::from_millis(ms))
    }
}

/// Counts a request in flight (on its listener and its connection) until dropped.
#[derive(Debug)]
struct InFlight {
    port: Arc<PortGuard>,
    conn: Arc<ConnActivity>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.port.inflight.fetch_sub(1, Ordering::Relaxed);
        let ms = u64::try_from(self.conn.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.conn.last_done_ms.fetch_max(ms, Ordering::AcqRel);
        self.conn.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The guarded service of one connection.
#[derive(Clone)]
pub(super) struct Guard<S> {
    pub(super) inner: S,
    pub(super) port: Arc<PortGuard>,
    pub(super) conn: Arc<ConnActivity>,
}

/// What a listener serves (tonic's `Routes`, an axum `Router`, the peer service): a cloneable
/// service of guarded requests whose failures are responses, never errors, and which is always
/// ready (so `call` needs no `poll_ready` first: true of all three).
pub trait Served: Clone + Send + 'static {
    type Body: ResponseBody;
    type Future: Future<Output = Result<Response<Self::Body>, Infallible>> + Send + 'static;
    fn serve(&mut self, request: Request<RequestBody>) -> Self::Future;
}

impl<S, B> Served for S
where
    S: tower_service::Service<Request<RequestBody>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: ResponseBody,
{
    type Body = B;
    type Future = S::Future;
    fn serve(&mut self, request: Request<RequestBody>) -> S::Future {
        self.call(request)
    }
}

/// The body of a served response.
pub trait ResponseBody: Body<Data = Bytes, Error: Into<BoxError>> + Send + Unpin + 'static {}

impl<B> ResponseBody for B where
    B: Body<Data = Bytes, Error: Into<BoxError>> + Send + Unpin + 'static
{
}

impl<S: Served> tower_service::Service<Request<Incoming>> for Guard<S> {
    type Response = GuardedResponse<S::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Incoming>) -> Self::Future {
        // Borrowed: the request's one owned handle on its listener is its `InFlight`, so a
        // request changes the listener's shared reference count once, not once per use.
        let port = &self.port;
        let Some(inflight) = self.admit() else {
            port.stats.refused_inflight.fetch_add(1, Ordering::Relaxed);
            let message = format!(
                "{} has {} requests in flight, its limit (SLUICE_MAX_INFLIGHT_REQUESTS); try again",
                port.port, port.max_inflight
            );
            let refusal = refuse(port.protocol, Refusal::Busy, message);
            return Box::pin(async move { Ok(refusal.map(|b| Tracked::new(b, None))) });
        };
        let deadline = match port.protocol {
            Protocol::Grpc => grpc_timeout(request.headers())
                .map_or(port.request_timeout, |t| t.min(port.request_timeout)),
            Protocol::Http => port.request_timeout,
        };
        let request = request.map(|body| RequestBody {
            inner: body,
            frames: port.grpc.as_ref().map(|(max, budget)| FrameCheck {
                max: *max,
                budget: budget.clone(),
                port: port.clone(),
                header: [0; 5],
                have: 0,
                remaining: 0,
                reserved: None,
            }),
        });
        let mut inner = self.inner.clone();
        Box::pin(async move {
            match tokio::time::timeout(deadline, inner.serve(request)).await {
                Ok(Ok(response)) => {
                    Ok(response.map(|b| Tracked::new(Either::Left(b), Some(inflight))))
                }
                Err(_) => {
                    let port = &inflight.port;
                    port.stats.deadline_exceeded.fetch_add(1, Ordering::Relaxed);
                    let message = format!(
                        "the request did not finish within {} ms (SLUICE_REQUEST_TIMEOUT_MS, or the \
                         client's grpc-timeout if shorter)",
                        deadline.as_millis()
                    );
                    Ok(refuse(port.protocol, Refusal::Deadline, message)
                        .map(|b| Tracked::new(b, Some(inflight))))
                }
            }
        })
    }
}

impl<S> Guard<S> {
    /// Counts a new request in flight, or `None` when the listener is at its cap.
    fn admit(&self) -> Option<InFlight> {
        let port = &self.port;
        if port.inflight.fetch_add(1, Ordering::Relaxed) >= port.max_inflight {
            port.inflight.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        self.conn.inflight.fetch_add(1, Ordering::AcqRel);
        Some(InFlight {
            port: port.clone(),
            conn: self.conn.clone(),
        })
    }
}

#[derive(Clone, Copy)]
enum Refusal {
    Busy,
    Deadline,
}

/// The guard's own answer: a gRPC status (HTTP 200, `grpc-status` in the headers) or an HTTP
/// status with a one-line text body.
fn refuse<B>(
    protocol: Protocol,
    why: Refusal,
    message: String,
) -> Response<Either<B, Full<Bytes>>> {
    match protocol {
        Protocol::Grpc => {
            let status = match why {
                Refusal::Busy => tonic::Status::resource_exhausted(message),
                Refusal::Deadline => tonic::Status::deadline_exceeded(message),
            };
            status.into_http::<Full<Bytes>>().map(Either::Right)
        }
        Protocol::Http => {
            let status = match why {
                Refusal::Busy => StatusCode::SERVICE_UNAVAILABLE,
                Refusal::Deadline => StatusCode::REQUEST_TIMEOUT,
            };
            let mut response = Response::new(Either::Right(Full::from(format!("{message}\n"))));
            *response.status_mut() = status;
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            // A refused or timed-out request says nothing about the next one on this
            // connection, but a client this slow is better off reconnecting.
            response.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
            response
        }
    }
}

/// The `grpc-timeout` header: up to eight digits and a unit (H, M, S, m, u, n).
fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// A response body that keeps its request counted in flight until it ends or is dropped.
pub(crate) struct Tracked<B> {
    inner: B,
    inflight: Option<InFlight>,
}

impl<B> Tracked<B> {
    fn new(inner: B, inflight: Option<InFlight>) -> Self {
        Tracked { inner, inflight }
    }
}

impl<B> Body for Tracked<B>
where
    B: Body + Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if frame.is_none() {
            // Done: the request stops counting now, not whenever hyper drops the body.
            this.inflight = None;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The request body the inner service reads: the connection's body, with each gRPC message's
/// length prefix checked as it streams by.
pub struct RequestBody {
    inner: Incoming,
    frames: Option<FrameCheck>,
}

/// Where the stream is in gRPC's framing: a 5-byte prefix (flag, big-endian length), then the
/// message.
struct FrameCheck {
    max: usize,
    budget: Arc<ByteBudget>,
    port: Arc<PortGuard>,
    header: [u8; 5],
    /// Prefix bytes seen of the current message.
    have: usize,
    /// Message bytes still to come after a complete prefix.
    remaining: usize,
    /// The current message's reservation from the budget.
    reserved: Option<OwnedSemaphorePermit>,
}

impl FrameCheck {
    /// Walks one chunk through the framing; an error status when a prefix announces too much.
    fn inspect(&mut self, mut chunk: &[u8]) -> Result<(), tonic::Status> {
        while !chunk.is_empty() {
            if self.remaining > 0 {
                let n = self.remaining.min(chunk.len());
                self.remaining -= n;
                chunk = &chunk[n..];
                continue;
            }
            let n = (5 - self.have).min(chunk.len());
            self.header[self.have..self.have + n].copy_from_slice(&chunk[..n]);
            self.have += n;
            chunk = &chunk[n..];
            if self.have == 5 {
                self.have = 0;
                let len = u32::from_be_bytes([
                    self.header[1],
                    self.header[2],
                    self.header[3],
                    self.header[4],
                ]) as usize;
                self.admit(len)?;
                self.remaining = len;
            }
        }
        Ok(())
    }

    fn admit(&mut self, len: usize) -> Result<(), tonic::Status> {
        // The previous message is complete: its reservation goes back first.
        self.reserved = None;
        if len > self.max {
            self.port
                .stats
                .refused_message_size
                .fetch_add(1, Ordering::Relaxed);
            return Err(tonic::Status::invalid_argument(format!(
                "request message is {len} bytes; the limit is {} bytes (SLUICE_MAX_REQUEST_BYTES)",
                self.max
            )));
        }
        // `len` fits in u32: it came from four bytes.
        match self.budget.try_reserve(len as u32) {
            Some(permit) => {
                self.reserved = Some(permit);
                Ok(())
            }
            None => {
                self.port
                    .stats
                    .refused_budget
                    .fetch_add(1, Ordering::Relaxed);
                Err(tonic::Status::resource_exhausted(format!(
                    "{} bytes of requests are being received already \
                     (SLUICE_MAX_PENDING_REQUEST_BYTES); try again",
                    self.budget.max
                )))
            }
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
            None => {
                if let Some(check) = &mut this.frames {
                    check.reserved = None;
                }
                return Poll::Ready(None);
            }
        };
        if let (Some(check), Some(data)) = (&mut this.frames, frame.data_ref())
            && let Err(status) = check.inspect(data.chunk())
        {
            // tonic finds the status in the error and answers with it.
            return Poll::Ready(Some(Err(Box::new(status))));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeout_header_units() {
        let parse = |v: &str| {
            let mut h = http::HeaderMap::new();
            h.insert("grpc-timeout", v.parse().unwrap());
            grpc_timeout(&h)
        };
        assert_eq!(parse("20m"), Some(Duration::from_millis(20)));
        assert_eq!(parse("1S"), Some(Duration::from_secs(1)));
        assert_eq!(parse("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse("500u"), Some(Duration::from_micros(500)));
        assert_eq!(parse("7n"), Some(Duration::from_nanos(7)));
        assert_eq!(parse("123456789m"), None, "more than eight digits");
        assert_eq!(parse("m"), None);
        assert_eq!(parse("5x"), None);
        assert_eq!(parse("-5m"), None);
    }

    fn check(max: usize, budget: usize) -> (FrameCheck, Arc<ByteBudget>) {
        let budget = ByteBudget::new(budget);
        let port = Arc::new(PortGuard::new(
            "test",
            Protocol::Grpc,
            10,
            Duration::from_secs(1),
            None,
        ));
        let check = FrameCheck {
            max,
            budget: budget.clone(),
            port,
            header: [0; 5],
            have: 0,
            remaining: 0,
            reserved: None,
        };
        (check, budget)
    }

    fn prefix(len: u32) -> Vec<u8> {
        let mut p = vec![0];
        p.extend_from_slice(&len.to_be_bytes());
        p
    }

    #[test]
    fn a_prefix_split_over_chunks_is_read_whole() {
        let (mut c, budget) = check(100, 1000);
        let p = prefix(10);
        c.inspect(&p[..2]).unwrap();
        assert_eq!(budget.in_use(), 0);
        c.inspect(&p[2..]).unwrap();
        assert_eq!(budget.in_use(), 10, "the announced length is reserved");
        c.inspect(&[7; 10]).unwrap();
        // A second message in the same chunk as the end of the first.
        let mut next = vec![1, 2];
        next.extend(prefix(20));
        let (mut c2, budget2) = check(100, 1000);
        c2.inspect(&prefix(2)).unwrap();
        c2.inspect(&next).unwrap();
        assert_eq!(
            budget2.in_use(),
            20,
            "the first message's reservation went back"
        );
    }

    #[test]
    fn a_long_message_is_refused_at_its_prefix() {
        let (mut c, budget) = check(100, 1000);
        let err = c.inspect(&prefix(101)).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("101 bytes"), "{}", err.message());
        assert!(
            err.message().contains("SLUICE_MAX_REQUEST_BYTES"),
            "{}",
            err.message()
        );
        assert_eq!(budget.in_use(), 0);
        c.inspect(&prefix(100)).unwrap();
    }

    #[test]
    fn the_budget_is_shared_and_given_back() {
        let (mut a, budget) = check(100, 150);
        let mut b = FrameCheck {
            max: 100,
            budget: budget.clone(),
            port: a.port.clone(),
            header: [0; 5],
            have: 0,
            remaining: 0,
            reserved: None,
        };
        a.inspect(&prefix(100)).unwrap();
        let err = b.inspect(&prefix(60)).unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(err.message().contains("SLUICE_MAX_PENDING_REQUEST_BYTES"));
        drop(a);
        b.inspect(&prefix(60)).unwrap();
        assert_eq!(budget.in_use(), 60);
    }
}
