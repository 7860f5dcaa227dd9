use std::time::Duration;

use super::*;
use crate::cli::test_server::{Reply, serve};

/// Limits small enough for a test to pass them.
const SMALL: Limits = Limits {
    timeout: Duration::from_millis(300),
    max_answer_bytes: 16,
};

fn get(addr: &str, limits: Limits, paths: &[&str]) -> Result<Vec<Answer>, String> {
    let mut client = Client::new(addr, limits)?;
    block_on(async {
        let mut answers = Vec::new();
        for path in paths {
            answers.push(client.get(path).await?);
        }
        Ok(answers)
    })
}

fn answer(status: u16, body: &str) -> Answer {
    Answer {
        status,
        body: body.into(),
    }
}

#[test]
fn a_chunked_answer_is_read_whole_and_the_connection_kept() {
    let mut server = serve(vec![
        Reply::chunked(200, &["{\"a\":", "1}"]),
        Reply::length(404, "no"),
    ]);
    let answers = get(&server.addr, LIMITS, &["/one", "/two"]).unwrap();
    assert_eq!(answers, [answer(200, "{\"a\":1}"), answer(404, "no")]);
    let requests = server.requests();
    assert!(
        requests[0].starts_with("GET /one HTTP/1.1\r\n"),
        "{requests:?}"
    );
    let host = format!("\r\nhost: {}\r\n", server.addr);
    assert!(
        requests[0].to_ascii_lowercase().contains(&host),
        "{requests:?}"
    );
    assert_eq!(server.connections(), 1);
}

#[test]
fn an_answer_that_closes_the_connection_is_read_and_the_next_call_reconnects() {
    let mut server = serve(vec![
        Reply::raw("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end").then_close(),
        Reply::length(200, "again"),
    ]);
    let answers = get(&server.addr, LIMITS, &["/a", "/b"]).unwrap();
    assert_eq!(
        answers,
        [answer(200, "until the end"), answer(200, "again")]
    );
    assert_eq!(server.connections(), 2);
}

/// A server that closes a kept-alive connection while it is idle (its idle timeout): the
/// next call goes on a new one.
#[test]
fn a_kept_alive_connection_closed_while_idle_is_replaced() {
    let mut server = serve(vec![
        Reply::length(200, "first").then_close(),
        Reply::length(200, "second"),
    ]);
    let mut client = Client::new(&server.addr, LIMITS).unwrap();
    let answers = block_on(async {
        let first = client.get("/").await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok([first, client.get("/").await?])
    })
    .unwrap();
    assert_eq!(answers, [answer(200, "first"), answer(200, "second")]);
    assert_eq!(server.connections(), 2);
}

#[test]
fn a_body_over_the_bound_is_refused_not_cut() {
    let server = serve(vec![Reply::chunked(200, &["0123456789", "0123456789"])]);
    let err = get(&server.addr, SMALL, &["/"]).unwrap_err();
    assert_eq!(err, format!("{} answered more than 16 bytes", server.addr));
    let server = serve(vec![Reply::length(200, "01234567890123456")]);
    let err = get(&server.addr, SMALL, &["/"]).unwrap_err();
    assert_eq!(err, format!("{} answered more than 16 bytes", server.addr));
}

#[test]
fn an_answer_that_does_not_finish_in_time_is_given_up() {
    let head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n";
    let server = serve(vec![Reply::raw(head).then_stall(Duration::from_secs(2))]);
    let err = get(&server.addr, SMALL, &["/"]).unwrap_err();
    assert_eq!(err, format!("no answer from {} within 300ms", server.addr));
}

#[test]
fn a_chunked_answer_cut_short_is_an_error() {
    let head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n";
    let server = serve(vec![Reply::raw(head).then_close()]);
    let err = get(&server.addr, LIMITS, &["/"]).unwrap_err();
    assert!(
        err.starts_with(&format!("no answer from {}: ", server.addr)),
        "{err}"
    );
}

#[test]
fn what_is_not_http_is_named() {
    let server = serve(vec![Reply::raw("SSH-2.0-OpenSSH\r\n\r\n").then_close()]);
    let err = get(&server.addr, LIMITS, &["/"]).unwrap_err();
    assert_eq!(err, format!("{} did not answer HTTP", server.addr));
}

#[test]
fn a_port_nobody_listens_on_cannot_be_connected_to() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let err = get(&addr, LIMITS, &["/"]).unwrap_err();
    assert!(
        err.starts_with(&format!("cannot connect to {addr}: ")),
        "{err}"
    );
    // No port: refused before any lookup.
    let err = get("127.0.0.1", LIMITS, &["/"]).unwrap_err();
    assert_eq!(err, "cannot resolve 127.0.0.1: invalid socket address");
}
