//! The command-line tools' HTTP/1.1 client, for `sluice explain --debug-address` and `sluice
//! probe`: hyper's client connection over one TCP connection to the address given, kept alive
//! from one call to the next (and replaced when the server closes it). hyper reads the answer's
//! framing (`Content-Length`, chunked transfer encoding, the end of a `Connection: close`
//! answer); this module bounds what it reads: each call within [`Limits::timeout`] (connecting
//! included), each answer's body within [`Limits::max_answer_bytes`].

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{CONTENT_TYPE, HOST};
use hyper_util::rt::TokioIo;
use tokio::time::Instant;

/// How long a call may take and how much of an answer is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// From the start of a call (connecting, when it has to) to the answer's last byte.
    pub timeout: Duration,
    /// The most bytes of an answer's body; a longer answer is an error, not cut short.
    pub max_answer_bytes: usize,
}

/// The limits docs/settings.md gives for `sluice explain` and `sluice probe`: 10 s per call,
/// answers up to 8 MiB.
pub(crate) const LIMITS: Limits = Limits {
    timeout: Duration::from_secs(10),
    max_answer_bytes: 8 << 20,
};

/// An answer: its status and its body (invalid UTF-8 replaced).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Answer {
    pub status: u16,
    pub body: String,
}

/// A client of one `host:port`. Must be used inside a tokio runtime with I/O and time
/// ([`block_on`] makes one).
pub(crate) struct Client {
    /// As the operator gave it: named in errors and sent as `Host`.
    addr: String,
    /// The first address it resolves to, as `sluice explain` has always used.
    target: SocketAddr,
    limits: Limits,
    /// The open connection, when there is one.
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Client {
    /// Resolves `addr` (`host:port`); nothing is connected yet.
    pub(crate) fn new(addr: &str, limits: Limits) -> Result<Self, String> {
        use std::net::ToSocketAddrs;
        let target = addr
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {addr}: {e}"))?
            .next()
            .ok_or_else(|| format!("cannot resolve {addr}: no address"))?;
        Ok(Client {
            addr: addr.to_owned(),
            target,
            limits,
            sender: None,
        })
    }

    /// `GET path`.
    pub(crate) async fn get(&mut self, path: &str) -> Result<Answer, String> {
        self.call(hyper::Method::GET, path, String::new()).await
    }

    /// `POST path` with a JSON body.
    pub(crate) async fn post_json(&mut self, path: &str, json: &str) -> Result<Answer, String> {
        self.call(hyper::Method::POST, path, json.to_owned()).await
    }

    /// One call within [`Limits::timeout`], on the open connection or a new one.
    async fn call(
        &mut self,
        method: hyper::Method,
        path: &str,
        body: String,
    ) -> Result<Answer, String> {
        let deadline = Instant::now() + self.limits.timeout;
        let request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, &self.addr)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("cannot send to {}: {e}", self.addr))?;
        let response = self.send(request, deadline).await?;
        let status = response.status().as_u16();
        let max_bytes = self.limits.max_answer_bytes;
        let body = Limited::new(response.into_body(), max_bytes).collect();
        let body = tokio::time::timeout_at(deadline, body)
            .await
            .map_err(|_| self.late())?
            .map_err(|e| body_error(&self.addr, max_bytes, &*e))?
            .to_bytes();
        let body = String::from_utf8_lossy(&body).into_owned();
        Ok(Answer { status, body })
    }

    /// Sends `request` and waits for the answer's head, by `deadline`. A kept-alive connection
    /// the server closed before taking the request is replaced, and the request sent once more
    /// (hyper gives it back when it wrote none of it).
    async fn send(
        &mut self,
        request: hyper::Request<Full<Bytes>>,
        deadline: Instant,
    ) -> Result<hyper::Response<Incoming>, String> {
        let reused = self.sender.is_some();
        let sender = self.connection(deadline).await?;
        let sent = tokio::time::timeout_at(deadline, sender.try_send_request(request))
            .await
            .map_err(|_| self.late())?;
        let mut e = match sent {
            Ok(response) => return Ok(response),
            Err(e) => e,
        };
        match e.take_message() {
            Some(request) if reused => {
                self.sender = None;
                let sender = self.connection(deadline).await?;
                let sent = tokio::time::timeout_at(deadline, sender.send_request(request))
                    .await
                    .map_err(|_| self.late())?;
                sent.map_err(|e| answer_error(&self.addr, &e))
            }
            _ => Err(answer_error(&self.addr, e.error())),
        }
    }

    /// The open connection when it can take another request, else a new one, by `deadline`.
    async fn connection(
        &mut self,
        deadline: Instant,
    ) -> Result<&mut SendRequest<Full<Bytes>>, String> {
        if let Some(mut sender) = self.sender.take() {
            // Fails at once when the connection is closed (the server closed it, or said it
            // would with its last answer).
            if sender.ready().await.is_ok() {
                return Ok(self.sender.insert(sender));
            }
        }
        let connect = async {
            let stream = tokio::net::TcpStream::connect(self.target)
                .await
                .map_err(|e| format!("cannot connect to {}: {e}", self.addr))?;
            let (sender, connection) = http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| format!("cannot connect to {}: {e}", self.addr))?;
            // Drives the connection; ends when it closes, or with the runtime.
            tokio::spawn(connection);
            Ok::<_, String>(sender)
        };
        let sender = tokio::time::timeout_at(deadline, connect)
            .await
            .map_err(|_| format!("cannot connect to {}: connection timed out", self.addr))??;
        Ok(self.sender.insert(sender))
    }

    /// The call's time is up.
    fn late(&self) -> String {
        format!(
            "no answer from {} within {:?}",
            self.addr, self.limits.timeout
        )
    }
}

/// Why no answer came: not HTTP, or the error and its causes (hyper's own say little more
/// than "connection closed before message completed").
fn answer_error(addr: &str, e: &hyper::Error) -> String {
    if e.is_parse() || e.is_parse_status() {
        return format!("{addr} did not answer HTTP");
    }
    let mut text = format!("no answer from {addr}: {e}");
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// Why an answer's body could not be read: too long, or cut off (a chunked answer's last
/// chunk or the bytes `Content-Length` promised never came).
fn body_error(addr: &str, max_bytes: usize, e: &(dyn std::error::Error + 'static)) -> String {
    if e.is::<LengthLimitError>() {
        format!("{addr} answered more than {max_bytes} bytes")
    } else if let Some(e) = e.downcast_ref::<hyper::Error>() {
        answer_error(addr, e)
    } else {
        format!("no answer from {addr}: {e}")
    }
}

/// Runs `call` to its end on a new single-threaded runtime (I/O and timers on): the tools make
/// a call or two and exit.
pub(crate) fn block_on<T>(call: impl Future<Output = Result<T, String>>) -> Result<T, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?
        .block_on(call)
}

#[cfg(test)]
mod tests;
