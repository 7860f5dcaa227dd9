//! HAProxy's way to ask an external service, SPOE: Sluice as a Stream Processing Offload Agent
//! on SPOA_HOST:SPOA_PORT (off unless SPOA_PORT is set). HAProxy has no `auth_request`; its SPOE
//! filter sends a NOTIFY frame with the arguments of a `spoe-message` before the `http-request`
//! rules run, and the agent's ACK sets variables the rules read (`http-request deny
//! deny_status 429 ... if { var(txn.sluice.over) -m bool }`). The protocol is in [`frame`].
//!
//! **The message.** Any message name; its arguments are the request:
//!
//! | argument | meaning |
//! |---|---|
//! | `domain` (string, required) | the domain |
//! | `<n>.<key>` | entry `key` of descriptor `n` (0, 1, ...), in argument order within it |
//! | `hits_addend` (integer, optional) | the request's hits addend (0 means 1) |
//! | `negative_hits` (boolean, optional) | `true`: every descriptor is a refund, its hits taken off (`is_negative_hits`), answered OK; what a message on `on-http-response` sends to count requests in flight |
//!
//! as in `args domain=str(edge) 0.remote_address=src 1.api_key=req.hdr(x-api-key)`. Values are
//! strings as they are (bytes that are not UTF-8 replaced), integers in decimal, addresses as
//! text, booleans `true`/`false`. A value HAProxy sends as NULL (an absent header) leaves its
//! whole descriptor out, as Envoy does. Each argument is a sample the HAProxy config chose, so a
//! client cannot add a descriptor or choose the domain; it controls only the values it sends.
//!
//! **The answer**, variables of the transaction scope (HAProxy prefixes them with the agent's
//! `option var-prefix`, `sluice` in the example): `code` (`OK` or `OVER_LIMIT`), `over` (a
//! boolean), and when a limit matched `limit`, `remaining` and `reset` (seconds): the numbers
//! `/forward-auth` puts in `RateLimit-Limit`, `-Remaining` and `-Reset`. When no decision can
//! be made (bad arguments, no config, the backend down and the domain not failing open) only
//! `error` is set, with the reason: the HAProxy config decides, and the example fails closed.
//!
//! **Bounds.** Frames longer than SLUICE_SPOA_MAX_FRAME_BYTES (or than HAProxy's own
//! `max-frame-size`, whichever is lower) close the connection with an AGENT-DISCONNECT
//! "frame is too big"; malformed frames with "invalid frame". The HELLO must arrive within
//! SLUICE_HEADER_TIMEOUT_MS, each frame's bytes once its length has arrived within
//! SLUICE_REQUEST_TIMEOUT_MS (which also bounds each decision), and a connection with no frame
//! for SLUICE_IDLE_TIMEOUT_SECS is closed; at most SLUICE_MAX_CONNECTIONS are open. Frames on a
//! connection are answered one at a time, in order (pipelining is announced: HAProxy may send
//! the next NOTIFY before the ACK, and it waits in the socket).

mod frame;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

use self::frame::{Frame, FrameError, Status, Typed};
use super::bad_request::BadRequest;
use crate::descriptor::{Descriptor, Entry, Request};
use crate::net::accept::Acceptor;
use crate::net::{ByteBudget, Limits};
use crate::service::{Code, RateLimitService};
use crate::store::CounterStore;
use crate::telemetry::otlp::{RequestTrace, Transport};

/// SLUICE_SPOA_MAX_FRAME_BYTES' default: HAProxy's own default (`tune.bufsize` 16384 less the
/// 4-byte length).
pub(crate) const DEFAULT_MAX_FRAME_BYTES: u32 = 16_380;
/// The largest SLUICE_SPOA_MAX_FRAME_BYTES accepted.
pub(crate) const MAX_FRAME_BYTES: u32 = 1024 * 1024;
/// The smallest, SPOP's own minimum.
pub(crate) const MIN_FRAME_BYTES: u32 = frame::MIN_FRAME_SIZE;

/// What a connection keeps of its frame buffer between frames; a larger one is freed, since
/// its bytes are no longer reserved from the budget.
const KEPT_BUFFER_BYTES: usize = 4096;

/// The longest `error` variable sent: enough for any of Sluice's reasons, small beside a frame.
const MAX_ERROR_BYTES: usize = 200;

/// The agent's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpoaOptions {
    /// SLUICE_SPOA_MAX_FRAME_BYTES: the largest frame announced in AGENT-HELLO and accepted.
    pub max_frame_bytes: u32,
}

/// Serves SPOP on `listener` until `stop`; each connection then finishes the frame it is
/// answering and is told the agent is going away (an AGENT-DISCONNECT). Each frame being read
/// reserves its bytes from `budget` (SLUICE_MAX_PENDING_REQUEST_BYTES, shared with the gRPC
/// listeners), so connections cost at most that much beyond a small buffer each.
pub(crate) async fn serve<S: CounterStore>(
    listener: TcpListener,
    service: Arc<RateLimitService<S>>,
    (options, limits, budget): (SpoaOptions, Limits, Arc<ByteBudget>),
    stop: impl std::future::Future<Output = ()>,
) {
    let mut acceptor = Acceptor::new(listener.into(), limits.max_connections, "SPOA_PORT");
    let (stopping, stopped) = watch::channel(false);
    let limits = Arc::new(limits);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            (io, permit) = acceptor.next() => {
                let conn = Connection {
                    service: service.clone(),
                    options,
                    limits: limits.clone(),
                    budget: budget.clone(),
                    stop: stopped.clone(),
                };
                tokio::spawn(async move {
                    let _slot = permit;
                    conn.run(io).await;
                });
            }
            () = &mut stop => {
                let _ = stopping.send(true);
                return;
            }
        }
    }
}

/// Why a connection ends, and what HAProxy is told.
#[derive(Debug)]
struct Close {
    status: Status,
    message: String,
}

impl Close {
    fn new(status: Status, message: impl Into<String>) -> Self {
        Close {
            status,
            message: message.into(),
        }
    }
}

impl From<FrameError> for Close {
    fn from(e: FrameError) -> Self {
        Close::new(Status::Invalid, format!("invalid frame: {e}"))
    }
}

/// One HAProxy connection.
struct Connection<S> {
    service: Arc<RateLimitService<S>>,
    options: SpoaOptions,
    limits: Arc<Limits>,
    budget: Arc<ByteBudget>,
    stop: watch::Receiver<bool>,
}

impl<S: CounterStore> Connection<S> {
    async fn run<T>(mut self, mut io: T)
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let mut buf = Vec::new();
        let close = match self.serve(&mut io, &mut buf).await {
            Ok(()) => return,
            Err(close) => close,
        };
        if close.status != Status::Normal || !close.message.is_empty() {
            tracing::debug!(status = ?close.status, message = %close.message, "SPOA connection closed");
        }
        let payload = frame::kv_payload(&[
            ("status-code", Typed::Uint32(close.status as u32)),
            ("message", Typed::String(close.message.as_bytes())),
        ]);
        let bytes = frame::encode(frame::AGENT_DISCONNECT, 0, 0, &payload);
        let write = async {
            io.write_all(&bytes).await?;
            io.shutdown().await
        };
        let _ = tokio::time::timeout(self.limits.header_read_timeout, write).await;
    }

    /// The HELLO handshake, then frames until HAProxy disconnects; `Err` says how to close.
    /// `Ok` means the connection is already done with (a health check, or the peer gone).
    async fn serve<T>(&mut self, io: &mut T, buf: &mut Vec<u8>) -> Result<(), Close>
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let ours = self.options.max_frame_bytes;
        let first = tokio::time::timeout(self.limits.header_read_timeout, read_len(io))
            .await
            .map_err(|_| Close::new(Status::Timeout, "no HAPROXY-HELLO in time"))?;
        let Some(len) = first else { return Ok(()) };
        let reserved = self.read_body(io, len, ours, buf).await?;
        let hello = Frame::parse(buf)?;
        if hello.kind != frame::HAPROXY_HELLO {
            return Err(Close::new(Status::Invalid, "expected HAPROXY-HELLO first"));
        }
        let (size, healthcheck) = negotiate(&hello, ours)?;
        let reply = frame::kv_payload(&[
            ("version", Typed::String(b"2.0")),
            ("max-frame-size", Typed::Uint32(size)),
            ("capabilities", Typed::String(b"pipelining")),
        ]);
        write(io, &frame::encode(frame::AGENT_HELLO, 0, 0, &reply)).await?;
        drop(reserved);
        if healthcheck {
            return Ok(());
        }
        loop {
            // A large frame's buffer is not kept while the connection waits for the next one.
            if buf.capacity() > KEPT_BUFFER_BYTES {
                *buf = Vec::new();
            }
            let Some(len) = self.next_len(io).await? else {
                return Ok(());
            };
            let reserved = self.read_body(io, len, size, buf).await?;
            let f = Frame::parse(buf)?;
            match f.kind {
                frame::NOTIFY => {
                    if f.flags & frame::FLAG_FIN == 0 {
                        return Err(Close::new(
                            Status::FragmentationNotSupported,
                            "payload fragmentation is not supported",
                        ));
                    }
                    if f.flags & frame::FLAG_ABORT != 0 {
                        continue;
                    }
                    let actions = self.notify(&f).await?;
                    let mut ack = frame::encode(frame::ACK, f.stream_id, f.frame_id, &actions);
                    // Many messages in one frame could make an ACK longer than HAProxy takes.
                    if ack.len() - 4 > size as usize {
                        let mut error = Vec::new();
                        Answer::Error("the answer to this frame's messages is over max-frame-size; send one message per event".into())
                            .write(&mut error);
                        ack = frame::encode(frame::ACK, f.stream_id, f.frame_id, &error);
                    }
                    write(io, &ack).await?;
                    drop(reserved);
                }
                frame::HAPROXY_DISCONNECT => return Err(Close::new(Status::Normal, "")),
                other => {
                    return Err(Close::new(
                        Status::Invalid,
                        format!("unexpected frame type {other}"),
                    ));
                }
            }
        }
    }

    /// The next frame's length; `None` when HAProxy closed the connection. Waits at most the
    /// idle timeout, and ends early when the agent stops.
    async fn next_len<T>(&mut self, io: &mut T) -> Result<Option<u32>, Close>
    where
        T: tokio::io::AsyncRead + Unpin,
    {
        let idle = self.limits.idle_timeout.unwrap_or(Duration::MAX);
        let stop = self.stop.wait_for(|stopped| *stopped);
        tokio::select! {
            read = tokio::time::timeout(idle, read_len(io)) => {
                read.map_err(|_| Close::new(Status::Timeout, "idle (SLUICE_IDLE_TIMEOUT_SECS)"))
            }
            _ = stop => Err(Close::new(Status::Normal, "Sluice is shutting down")),
        }
    }

    /// Reads a frame of `len` bytes into `buf`, refused past `max` or past what the byte budget
    /// has left, within the request timeout; the bytes stay reserved until the permit drops.
    async fn read_body<T>(
        &self,
        io: &mut T,
        len: u32,
        max: u32,
        buf: &mut Vec<u8>,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, Close>
    where
        T: tokio::io::AsyncRead + Unpin,
    {
        if len > max {
            return Err(Close::new(
                Status::TooBig,
                format!(
                    "a frame of {len} bytes; the limit is {max} (SLUICE_SPOA_MAX_FRAME_BYTES or HAProxy's max-frame-size)"
                ),
            ));
        }
        let reserved = self.budget.try_reserve(len).ok_or_else(|| {
            Close::new(
                Status::ResourceAllocation,
                format!(
                    "a frame of {len} bytes is over what SLUICE_MAX_PENDING_REQUEST_BYTES has left"
                ),
            )
        })?;
        buf.clear();
        buf.resize(len as usize, 0);
        tokio::time::timeout(self.limits.request_timeout, io.read_exact(buf))
            .await
            .map_err(|_| Close::new(Status::Timeout, "a frame's bytes did not arrive in time"))?
            .map_err(|e| Close::new(Status::Io, e.to_string()))?;
        Ok(reserved)
    }

    /// The ACK's actions for a NOTIFY: each message decided in turn.
    async fn notify(&self, f: &Frame<'_>) -> Result<Vec<u8>, Close> {
        let mut actions = Vec::new();
        for (_, args) in frame::messages(f.payload)? {
            let answer = match request_from_args(&args) {
                Ok(request) => self.decide(request).await,
                Err(e) => Answer::Error(e.to_string()),
            };
            answer.write(&mut actions);
        }
        Ok(actions)
    }

    async fn decide(&self, request: Request) -> Answer {
        if request.descriptors.is_empty() {
            return Answer::Decided {
                over: false,
                headers: None,
            };
        }
        let trace = RequestTrace {
            transport: Transport::Spoa,
            parent: None,
        };
        let decided = tokio::time::timeout(
            self.limits.request_timeout,
            self.service.should_rate_limit_traced(request, &trace),
        )
        .await;
        match decided {
            Ok(Ok(response)) => {
                let answer = Answer::Decided {
                    over: response.overall_code == Code::OverLimit,
                    headers: response
                        .rate_limit
                        .map(|rl| (rl.limit, rl.remaining, rl.reset_secs)),
                };
                response.recycle();
                answer
            }
            Ok(Err(e)) => Answer::Error(e.to_string()),
            Err(_) => Answer::Error("no decision within SLUICE_REQUEST_TIMEOUT_MS".into()),
        }
    }
}

/// What one message's decision sets.
enum Answer {
    Decided {
        over: bool,
        /// Limit, remaining, reset seconds, when a limit matched.
        headers: Option<(u32, u32, u64)>,
    },
    Error(String),
}

impl Answer {
    fn write(&self, out: &mut Vec<u8>) {
        let scope = frame::SCOPE_TRANSACTION;
        match self {
            Answer::Decided { over, headers } => {
                let code: &[u8] = if *over { b"OVER_LIMIT" } else { b"OK" };
                frame::put_set_var(out, scope, "code", &Typed::String(code));
                frame::put_set_var(out, scope, "over", &Typed::Bool(*over));
                if let Some((limit, remaining, reset)) = headers {
                    frame::put_set_var(out, scope, "limit", &Typed::Uint32(*limit));
                    frame::put_set_var(out, scope, "remaining", &Typed::Uint32(*remaining));
                    frame::put_set_var(out, scope, "reset", &Typed::Uint64(*reset));
                }
            }
            Answer::Error(reason) => {
                let mut end = reason.len().min(MAX_ERROR_BYTES);
                while !reason.is_char_boundary(end) {
                    end -= 1;
                }
                let text = Typed::String(&reason.as_bytes()[..end]);
                frame::put_set_var(out, scope, "error", &text);
            }
        }
    }
}

/// The frame size for the connection and whether the HELLO is a health check.
fn negotiate(hello: &Frame<'_>, ours: u32) -> Result<(u32, bool), Close> {
    let (mut versions, mut size, mut capabilities, mut healthcheck) = (None, None, None, false);
    for (name, value) in hello.kv_list()? {
        match (name, value) {
            (b"supported-versions", Typed::String(v)) => versions = Some(v),
            (b"max-frame-size", Typed::Uint32(n)) => size = Some(u64::from(n)),
            (b"max-frame-size", Typed::Uint64(n)) => size = Some(n),
            (b"capabilities", Typed::String(c)) => capabilities = Some(c),
            (b"healthcheck", Typed::Bool(b)) => healthcheck = b,
            _ => {}
        }
    }
    let versions =
        versions.ok_or_else(|| Close::new(Status::NoVersion, "no supported-versions"))?;
    let speaks_2 = String::from_utf8_lossy(versions)
        .split(',')
        .any(|v| v.trim().split('.').next() == Some("2"));
    if !speaks_2 {
        return Err(Close::new(
            Status::BadVersion,
            "Sluice speaks SPOP 2.0 only",
        ));
    }
    let theirs = size.ok_or_else(|| Close::new(Status::NoFrameSize, "no max-frame-size"))?;
    if theirs < u64::from(frame::MIN_FRAME_SIZE) {
        return Err(Close::new(Status::BadFrameSize, "max-frame-size below 256"));
    }
    capabilities.ok_or_else(|| Close::new(Status::NoCapabilities, "no capabilities"))?;
    let size = u32::try_from(theirs.min(u64::from(ours))).unwrap_or(ours);
    Ok((size, healthcheck))
}

/// Why a NOTIFY message's arguments do not make a request; its text is the `error` variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ArgsError {
    #[error("no domain argument (a non-empty string)")]
    NoDomain,
    /// `value` is the typed value as sent, e.g. `Int32(-1)`.
    #[error("hits_addend {value} is not a number from 0 to 4294967295")]
    BadHitsAddend { value: String },
    #[error("negative_hits {value} is not a boolean")]
    BadNegativeHits { value: String },
    #[error("argument {0:?} is not domain, hits_addend, negative_hits or <descriptor index>.<key>")]
    UnknownArgument(String),
}

impl From<ArgsError> for BadRequest {
    fn from(e: ArgsError) -> Self {
        BadRequest::invalid(e)
    }
}

/// A message's arguments as a request, or why they do not make one.
fn request_from_args(args: &[(&[u8], Typed<'_>)]) -> Result<Request, BadRequest> {
    let mut domain = None;
    let mut hits_addend = 0;
    let mut negative_hits = false;
    // Descriptor index -> its entries, or `None` once one of its values was NULL.
    let mut descriptors: BTreeMap<u64, Option<Vec<Entry>>> = BTreeMap::new();
    for (name, value) in args {
        let name = String::from_utf8_lossy(name);
        match name.as_ref() {
            "domain" => domain = text(value).filter(|d| !d.is_empty()),
            "hits_addend" => {
                hits_addend = match value {
                    Typed::Null => 0,
                    v => integer(v)
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| ArgsError::BadHitsAddend {
                            value: format!("{v:?}"),
                        })?,
                }
            }
            "negative_hits" => {
                negative_hits = match value {
                    Typed::Null | Typed::Bool(false) => false,
                    Typed::Bool(true) => true,
                    v => match text(v).as_deref() {
                        Some("true" | "1") => true,
                        Some("false" | "0" | "") => false,
                        _ => {
                            let value = format!("{v:?}");
                            return Err(ArgsError::BadNegativeHits { value }.into());
                        }
                    },
                }
            }
            other => {
                let Some((index, key)) = other
                    .split_once('.')
                    .and_then(|(n, key)| Some((n.parse::<u64>().ok()?, key)))
                    .filter(|(_, key)| !key.is_empty())
                else {
                    return Err(ArgsError::UnknownArgument(other.to_owned()).into());
                };
                let slot = descriptors.entry(index).or_insert_with(|| Some(Vec::new()));
                match (slot.as_mut(), text(value)) {
                    (Some(entries), Some(value)) => entries.push(Entry::new(key, value)),
                    // An absent sample: the whole descriptor is left out.
                    _ => *slot = None,
                }
            }
        }
    }
    let domain = domain.ok_or(ArgsError::NoDomain)?;
    Ok(Request {
        domain,
        descriptors: descriptors
            .into_values()
            .flatten()
            .map(|entries| Descriptor {
                entries,
                negative_hits,
                ..Default::default()
            })
            .collect(),
        hits_addend,
    })
}

/// A value as descriptor text; `None` for NULL.
fn text(value: &Typed<'_>) -> Option<String> {
    Some(match value {
        Typed::Null => return None,
        Typed::Bool(b) => b.to_string(),
        Typed::Int32(n) => n.to_string(),
        Typed::Uint32(n) => n.to_string(),
        Typed::Int64(n) => n.to_string(),
        Typed::Uint64(n) => n.to_string(),
        Typed::Ipv4(a) => a.to_string(),
        Typed::Ipv6(a) => a.to_string(),
        Typed::String(b) | Typed::Binary(b) => String::from_utf8_lossy(b).into_owned(),
    })
}

fn integer(value: &Typed<'_>) -> Option<i128> {
    match value {
        Typed::Int32(n) => Some(i128::from(*n)),
        Typed::Uint32(n) => Some(i128::from(*n)),
        Typed::Int64(n) => Some(i128::from(*n)),
        Typed::Uint64(n) => Some(i128::from(*n)),
        _ => None,
    }
}

/// A frame's 4-byte length; `None` when the connection closed before it.
async fn read_len<T: tokio::io::AsyncRead + Unpin>(io: &mut T) -> Option<u32> {
    let mut len = [0u8; 4];
    io.read_exact(&mut len).await.ok()?;
    Some(u32::from_be_bytes(len))
}

async fn write<T: tokio::io::AsyncWrite + Unpin>(io: &mut T, bytes: &[u8]) -> Result<(), Close> {
    io.write_all(bytes)
        .await
        .map_err(|e| Close::new(Status::Io, e.to_string()))
}

#[cfg(test)]
mod tests;
