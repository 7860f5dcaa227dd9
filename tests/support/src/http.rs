//! The one HTTP/1.1 client of the tests, enough for `/json`, `/healthcheck`, `/stats`,
//! `/metrics`, `/rlconfig` and the debug port: one request with `Connection: close`, its answer
//! read to the end. Two ways to call it, sharing how the request is written ([`request`]) and the
//! answer read ([`parse`]):
//!
//! - [`http`] and [`http_to`] block, for the end-to-end tests that drive real processes from
//!   plain threads: `None` when nothing answered (what their waits poll for).
//! - [`http_async`] awaits, for the in-process tests whose Sluice runs on the test's own runtime
//!   (a blocking call there would stall the server it waits for): it panics when nothing
//!   answered within 10 s.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An answer: its status, its head (status line and headers) and its body.
pub struct HttpResponse {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

/// The request's bytes: `method path` to `addr` with `body`, closing the connection after.
pub fn request(addr: SocketAddr, method: &str, path: &str, body: &str) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// The answer in `raw`, the bytes read until the server closed; `None` without a status code or
/// the blank line ending the head.
pub fn parse(raw: &[u8]) -> Option<HttpResponse> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some(HttpResponse {
        status,
        headers: head.to_string(),
        body: body.to_string(),
    })
}

/// One request to 127.0.0.1:`port`: (status, body), or `None` if nothing answered.
pub fn http(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    http_to(([127, 0, 0, 1], port).into(), method, path, body)
}

/// [`http`] to any address, connecting within 5 s and reading for at most 5 s at a time.
pub fn http_to(addr: SocketAddr, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(request(addr, method, path, body).as_bytes())
        .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    parse(&raw).map(|r| (r.status, r.body))
}

/// One request to `addr` from async code, bounded by a 10 s timeout; panics if it fails.
pub async fn http_async(addr: SocketAddr, method: &str, path: &str, body: &str) -> HttpResponse {
    tokio::time::timeout(Duration::from_secs(10), async {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(request(addr, method, path, body).as_bytes())
            .await
            .expect("write");
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.expect("read");
        parse(&raw).expect("an HTTP answer with a status code")
    })
    .await
    .expect("HTTP request finished in time")
}
