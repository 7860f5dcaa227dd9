//! The listener limits (src/net) on real sockets: a gRPC message refused from its length
//! prefix, the shared byte budget, streams past the per-connection cap, deadlines, the cap on
//! requests in flight, slow and idle clients, and the connection cap. Each test sets its limit
//! low and would hang or see another answer without it; every wait is bounded.

#![allow(
    clippy::disallowed_methods,
    reason = "tests time real processes, sockets and deadlines; Sluice's code reads time through crate::clock"
)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sluice::app::AppOptions;
use sluice::net::Limits;
use sluice_test_support::app::{config_from_yaml, default_options, start_with};
use sluice_test_support::http::http_async;
use sluice_test_support::{app, process};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CONFIG: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

fn options(limits: Limits) -> AppOptions {
    AppOptions {
        listener_limits: limits,
        ..default_options()
    }
}

async fn start(limits: Limits) -> app::Running {
    start_with(config_from_yaml(CONFIG), options(limits)).await
}

/// An HTTP/2 client connection (the h2 crate: it sends exactly what a test asks for).
async fn h2(addr: SocketAddr) -> h2::client::SendRequest<Bytes> {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (client, conn) = h2::client::handshake(tcp).await.expect("HTTP/2 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client.ready().await.expect("connection ready")
}

/// Opens a gRPC call and returns its request stream, without sending a message.
async fn open_call(
    client: &mut h2::client::SendRequest<Bytes>,
    extra: &[(&str, &str)],
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    let mut request = http::Request::post(format!("http://sluice{SHOULD_RATE_LIMIT}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in extra {
        request = request.header(*k, *v);
    }
    let mut ready = client.clone().ready().await.expect("stream capacity");
    ready
        .send_request(request.body(()).unwrap(), false)
        .expect("send headers")
}

/// Polls the debug port's `/metrics` until it has the sample `line`: waits for the listener
/// state a step of a test needs (a reservation made, requests held) instead of sleeping in the
/// hope that it was reached.
async fn metric_reaches(debug: SocketAddr, line: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let metrics = http_async(debug, "GET", "/metrics", "").await.body;
        if metrics.lines().any(|l| l == line) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no `{line}` in /metrics after 10 s:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A message's 5-byte prefix announcing `len` bytes.
fn prefix(len: u32) -> Bytes {
    let mut p = vec![0u8];
    p.extend_from_slice(&len.to_be_bytes());
    Bytes::from(p)
}

/// The call's gRPC status code and message, from a trailers-only answer or the trailers.
async fn grpc_status(response: h2::client::ResponseFuture) -> (i32, String) {
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("an answer within 10 s")
        .expect("a response");
    let read = |h: &http::HeaderMap| {
        h.get("grpc-status").map(|s| {
            let code = s.to_str().unwrap().parse().unwrap();
            let message = h
                .get("grpc-message")
                .map(|m| percent_decode(m.to_str().unwrap()))
                .unwrap_or_default();
            (code, message)
        })
    };
    if let Some(status) = read(response.headers()) {
        return status;
    }
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let _ = chunk.expect("body");
    }
    let trailers = body
        .trailers()
        .await
        .expect("trailers")
        .expect("trailers present");
    read(&trailers).expect("grpc-status in the trailers")
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 3 <= b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

const INVALID_ARGUMENT: i32 = 3;
const DEADLINE_EXCEEDED: i32 = 4;
const RESOURCE_EXHAUSTED: i32 = 8;

#[tokio::test]
async fn a_message_longer_than_the_limit_is_refused_from_its_prefix() {
    let app = start(Limits::default()).await;
    let mut client = h2(app.grpc).await;
    let (response, mut body) = open_call(&mut client, &[]).await;
    // Ten megabytes announced, five bytes sent: the answer comes from the prefix alone.
    body.send_data(prefix(10_000_000), false).unwrap();
    let started = Instant::now();
    let (code, message) = grpc_status(response).await;
    assert_eq!(code, INVALID_ARGUMENT, "{message}");
    assert!(
        message.contains("10000000 bytes") && message.contains("SLUICE_MAX_REQUEST_BYTES"),
        "{message}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn the_pending_byte_budget_is_shared_and_given_back() {
    let app = start(Limits {
        max_pending_request_bytes: 100 * 1024,
        ..Limits::default()
    })
    .await;
    let mut first = h2(app.grpc).await;
    let mut second = h2(app.grpc).await;
    // 60 KiB announced and held open on one connection...
    let (held, mut held_body) = open_call(&mut first, &[]).await;
    held_body.send_data(prefix(60 * 1024), false).unwrap();
    // ... leaves too little for another 60 KiB on another connection.
    let (refused, mut body) = open_call(&mut second, &[]).await;
    // The first prefix is read, its 60 KiB reserved, before the second is sent.
    metric_reaches(app.debug, "sluice_listener_pending_request_bytes 61440").await;
    body.send_data(prefix(60 * 1024), false).unwrap();
    let (code, message) = grpc_status(refused).await;
    assert_eq!(code, RESOURCE_EXHAUSTED, "{message}");
    assert!(
        message.contains("SLUICE_MAX_PENDING_REQUEST_BYTES"),
        "{message}"
    );
    // Once the first call is gone its bytes are free again.
    held_body.send_reset(h2::Reason::CANCEL);
    drop(held);
    let mut accepted = false;
    for _ in 0..50 {
        let (response, mut body) = open_call(&mut second, &[]).await;
        body.send_data(prefix(60 * 1024), false).unwrap();
        let waited = tokio::time::timeout(Duration::from_millis(300), grpc_status(response)).await;
        match waited {
            // Still held: the reservation is given back; the call waits for its body.
            Err(_) => {
                accepted = true;
                break;
            }
            Ok((code, _)) => assert_eq!(code, RESOURCE_EXHAUSTED),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(accepted, "the budget was never given back");
}

#[tokio::test]
async fn a_call_whose_message_never_comes_ends_at_its_deadline() {
    let app = start(Limits {
        request_timeout: Duration::from_millis(300),
        ..Limits::default()
    })
    .await;
    let mut client = h2(app.grpc).await;
    let (response, _body) = open_call(&mut client, &[]).await;
    let started = Instant::now();
    let (code, message) = grpc_status(response).await;
    assert_eq!(code, DEADLINE_EXCEEDED, "{message}");
    assert!(message.contains("SLUICE_REQUEST_TIMEOUT_MS"), "{message}");
    assert!(started.elapsed() >= Duration::from_millis(250));
    // A client's grpc-timeout shorter than the setting wins.
    let app = start(Limits {
        request_timeout: Duration::from_secs(60),
        ..Limits::default()
    })
    .await;
    let mut client = h2(app.grpc).await;
    let (response, _body) = open_call(&mut client, &[("grpc-timeout", "200m")]).await;
    let (code, _) = grpc_status(response).await;
    assert_eq!(code, DEADLINE_EXCEEDED);
}

/// Raw HTTP/2 frames: a client that ignores the server's SETTINGS, as an attacker would.
mod raw {
    use super::*;

    pub const HEADERS: u8 = 1;
    pub const RST_STREAM: u8 = 3;
    pub const SETTINGS: u8 = 4;
    pub const PING: u8 = 6;
    pub const GOAWAY: u8 = 7;

    pub async fn connect(addr: SocketAddr) -> TcpStream {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        frame(&mut s, SETTINGS, 0, 0, &[]).await;
        s
    }

    pub async fn frame(s: &mut TcpStream, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        let len = (payload.len() as u32).to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        s.write_all(&f).await.unwrap();
    }

    /// A gRPC call's headers, HPACK literals without indexing (no END_STREAM: no body follows).
    pub fn call_headers() -> Vec<u8> {
        let mut block = Vec::new();
        for (name, value) in [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", SHOULD_RATE_LIMIT),
            (":authority", "sluice"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ] {
            block.push(0);
            block.push(name.len() as u8);
            block.extend_from_slice(name.as_bytes());
            block.push(value.len() as u8);
            block.extend_from_slice(value.as_bytes());
        }
        block
    }

    /// Reads one frame: (type, flags, stream, payload); `None` when the server closed.
    pub async fn read(s: &mut TcpStream) -> Option<(u8, u8, u32, Vec<u8>)> {
        let mut header = [0u8; 9];
        s.read_exact(&mut header).await.ok()?;
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let stream = u32::from_be_bytes([header[5] & 0x7f, header[6], header[7], header[8]]);
        let mut payload = vec![0u8; len];
        s.read_exact(&mut payload).await.ok()?;
        Some((header[3], header[4], stream, payload))
    }
}

#[tokio::test]
async fn streams_past_the_per_connection_cap_are_refused_and_held_ones_end() {
    let app = start(Limits {
        max_concurrent_streams: 10,
        request_timeout: Duration::from_millis(500),
        ..Limits::default()
    })
    .await;
    let mut s = raw::connect(app.grpc).await;
    let block = raw::call_headers();
    let opened = 200u32;
    for i in 0..opened {
        // END_HEADERS only: each call waits for a body that never comes.
        raw::frame(&mut s, raw::HEADERS, 0x4, 2 * i + 1, &block).await;
    }
    let (mut refused, mut answered) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while refused + answered < opened && Instant::now() < deadline {
        let Ok(Some((kind, flags, stream, payload))) =
            tokio::time::timeout(Duration::from_secs(5), raw::read(&mut s)).await
        else {
            break;
        };
        match kind {
            // REFUSED_STREAM (7): the client may retry it on another connection.
            raw::RST_STREAM if payload == [0, 0, 0, 7] => refused += 1,
            // The held calls' answers (DEADLINE_EXCEEDED, trailers-only: END_STREAM set).
            raw::HEADERS if flags & 1 == 1 && stream > 0 => answered += 1,
            raw::SETTINGS if flags & 1 == 0 => raw::frame(&mut s, raw::SETTINGS, 1, 0, &[]).await,
            _ => {}
        }
    }
    assert!(
        refused >= 150,
        "{refused} streams refused, {answered} answered"
    );
    assert!(
        (10..=20).contains(&answered),
        "{answered} answered, {refused} refused"
    );
    assert_eq!(
        refused + answered,
        opened,
        "every stream gets an answer or a refusal"
    );
}

/// The SETTINGS_MAX_CONCURRENT_STREAMS (id 3) a listener announces in its first SETTINGS.
async fn announced_streams(addr: SocketAddr) -> Option<u32> {
    let mut s = raw::connect(addr).await;
    loop {
        let (kind, flags, _, payload) =
            tokio::time::timeout(Duration::from_secs(5), raw::read(&mut s))
                .await
                .ok()??;
        if kind == raw::SETTINGS && flags & 1 == 0 {
            return payload.chunks(6).find_map(|e| {
                (u16::from_be_bytes([e[0], e[1]]) == 3)
                    .then(|| u32::from_be_bytes([e[2], e[3], e[4], e[5]]))
            });
        }
    }
}

#[tokio::test]
async fn grpc_max_concurrent_streams_caps_the_grpc_listener_only() {
    let app = start(Limits {
        max_concurrent_streams: 50,
        grpc_max_concurrent_streams: std::num::NonZeroU32::new(3),
        ..Limits::default()
    })
    .await;
    assert_eq!(announced_streams(app.grpc).await, Some(3));
    assert_eq!(announced_streams(app.http).await, Some(50));
    assert_eq!(announced_streams(app.debug).await, Some(50));
    // And it holds: of 20 calls opened at once, 3 are served, the others refused.
    let mut s = raw::connect(app.grpc).await;
    let block = raw::call_headers();
    for i in 0..20u32 {
        raw::frame(&mut s, raw::HEADERS, 0x4, 2 * i + 1, &block).await;
    }
    let mut refused = 0;
    while refused < 17 {
        let Ok(Some((kind, flags, _, payload))) =
            tokio::time::timeout(Duration::from_secs(5), raw::read(&mut s)).await
        else {
            break;
        };
        match kind {
            raw::RST_STREAM if payload == [0, 0, 0, 7] => refused += 1,
            raw::SETTINGS if flags & 1 == 0 => raw::frame(&mut s, raw::SETTINGS, 1, 0, &[]).await,
            _ => {}
        }
    }
    assert_eq!(refused, 17, "20 calls past a cap of 3");
}

#[tokio::test]
async fn requests_past_the_inflight_cap_are_refused_on_every_port() {
    let app = start(Limits {
        max_inflight_requests: 3,
        request_timeout: Duration::from_secs(30),
        ..Limits::default()
    })
    .await;
    let mut client = h2(app.grpc).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(open_call(&mut client, &[]).await);
    }
    metric_reaches(
        app.debug,
        "sluice_listener_inflight_requests{port=\"GRPC_PORT\"} 3",
    )
    .await;
    let (response, _body) = open_call(&mut client, &[]).await;
    let (code, message) = grpc_status(response).await;
    assert_eq!(code, RESOURCE_EXHAUSTED, "{message}");
    assert!(
        message.contains("SLUICE_MAX_INFLIGHT_REQUESTS"),
        "{message}"
    );

    // HTTP: three bodies promised and never sent hold the port's three slots.
    let mut slow = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(app.http).await.unwrap();
        s.write_all(b"POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
            .await
            .unwrap();
        slow.push(s);
    }
    metric_reaches(
        app.debug,
        "sluice_listener_inflight_requests{port=\"PORT\"} 3",
    )
    .await;
    let busy = http_async(app.http, "POST", "/json", "{}").await;
    assert_eq!(busy.status, 503, "{}", busy.body);
    assert!(
        busy.body.contains("SLUICE_MAX_INFLIGHT_REQUESTS"),
        "{}",
        busy.body
    );

    let metrics = http_async(app.debug, "GET", "/metrics", "").await.body;
    assert!(
        metrics
            .contains("sluice_listener_refused_total{port=\"GRPC_PORT\",reason=\"inflight\"} 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("sluice_listener_refused_total{port=\"PORT\",reason=\"inflight\"} 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("sluice_listener_inflight_requests{port=\"GRPC_PORT\"} 3\n"),
        "{metrics}"
    );
    process::promtool_check(&metrics);
}

/// Reads until the server closes the connection; the time it took, or `None` past `limit`.
async fn closed_within(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout_at((started + limit).into(), s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(started.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn a_client_dripping_its_request_head_is_disconnected() {
    let app = start(Limits {
        header_read_timeout: Duration::from_millis(400),
        ..Limits::default()
    })
    .await;
    let mut s = TcpStream::connect(app.http).await.unwrap();
    let head =
        b"GET /healthcheck HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let started = Instant::now();
    let mut closed = false;
    for byte in head {
        if s.write_all(&[*byte]).await.is_err() {
            closed = true;
            break;
        }
        let mut buf = [0u8; 256];
        match tokio::time::timeout(Duration::from_millis(100), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed = true;
                break;
            }
            _ => {}
        }
    }
    assert!(
        closed,
        "a client dripping one byte every 100 ms was kept for {:?}",
        started.elapsed()
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn idle_connections_are_closed() {
    let app = start(Limits {
        idle_timeout: Some(Duration::from_millis(500)),
        ..Limits::default()
    })
    .await;
    // HTTP/1.1 keep-alive, after one answered request.
    let mut s = TcpStream::connect(app.http).await.unwrap();
    s.write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let took = closed_within(&mut s, Duration::from_secs(10)).await;
    assert!(
        took.is_some(),
        "an idle HTTP/1.1 connection was kept for 10 s"
    );

    // HTTP/2 on the gRPC port: a GOAWAY, then the close.
    let mut s = raw::connect(app.grpc).await;
    let mut goaway = false;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        match tokio::time::timeout(Duration::from_secs(10), raw::read(&mut s)).await {
            Ok(Some((raw::GOAWAY, ..))) => goaway = true,
            Ok(Some((raw::SETTINGS, flags, ..))) if flags & 1 == 0 => {
                raw::frame(&mut s, raw::SETTINGS, 1, 0, &[]).await;
            }
            Ok(Some((raw::PING, flags, _, payload))) if flags & 1 == 0 => {
                raw::frame(&mut s, raw::PING, 1, 0, &payload).await;
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
    assert!(goaway, "no GOAWAY on an idle HTTP/2 connection");
    assert!(started.elapsed() < Duration::from_secs(10));
    let metrics = http_async(app.debug, "GET", "/metrics", "").await.body;
    assert!(
        metrics.contains("sluice_listener_idle_closed_total{port=\"GRPC_PORT\"} 1\n"),
        "{metrics}"
    );
}

#[tokio::test]
async fn connections_past_the_cap_wait_for_a_free_slot() {
    let app = start(Limits {
        max_connections: 2,
        ..Limits::default()
    })
    .await;
    let first = TcpStream::connect(app.http).await.unwrap();
    let _second = TcpStream::connect(app.http).await.unwrap();
    metric_reaches(app.debug, "sluice_listener_connections{port=\"PORT\"} 2").await;
    // The kernel completes the third handshake, but Sluice does not serve it.
    let mut third = TcpStream::connect(app.http).await.unwrap();
    third
        .write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 512];
    let waited = tokio::time::timeout(Duration::from_millis(500), third.read(&mut buf)).await;
    assert!(
        waited.is_err(),
        "a connection past SLUICE_MAX_CONNECTIONS was served"
    );
    drop(first);
    let n = tokio::time::timeout(Duration::from_secs(10), third.read(&mut buf))
        .await
        .expect("served once a slot was free")
        .unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
}
