//! `/nginx` over a real socket on port 0: the headers nginx's `auth_request` subrequest sends,
//! and the statuses and headers it reads back.

use std::time::Duration;

use sluice_test_support::app;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CONFIG: &str = "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";

async fn get(addr: std::net::SocketAddr, headers: &str) -> String {
    tokio::time::timeout(Duration::from_secs(10), async {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let req = format!("GET /nginx HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n");
        s.write_all(req.as_bytes()).await.expect("write");
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.expect("read");
        String::from_utf8_lossy(&raw).to_lowercase()
    })
    .await
    .expect("answered in time")
}

#[tokio::test]
async fn nginx_endpoint_answers_200_then_403_then_400() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.yaml");
    std::fs::write(&path, CONFIG).unwrap();
    let app = app::start(&path, app::default_options()).await;

    let h = "X-Sluice-Domain: edge\r\nX-Sluice-Descriptor: api_key=@x-api-key\r\nX-Api-Key: k\r\n";
    let ok = get(app.http, h).await;
    assert!(ok.starts_with("http/1.1 200"), "{ok}");
    assert!(ok.contains("\r\nratelimit-limit: 1\r\n"), "{ok}");
    assert!(ok.contains("\r\nratelimit-remaining: 0\r\n"), "{ok}");

    let over = get(app.http, h).await;
    assert!(over.starts_with("http/1.1 403"), "{over}");
    assert!(over.contains("\r\nretry-after: "), "{over}");
    assert!(over.contains("\r\nratelimit-reset: "), "{over}");

    let bad = get(app.http, "X-Sluice-Domain: edge\r\n").await;
    assert!(bad.starts_with("http/1.1 400"), "{bad}");
    assert!(
        bad.ends_with("missing x-sluice-descriptor header\n"),
        "{bad}"
    );
}

#[tokio::test]
async fn oversized_descriptor_headers_answer_400_naming_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.yaml");
    std::fs::write(&path, CONFIG).unwrap();
    let app = app::start(&path, app::default_options()).await;
    // 40 KB of client header copied twice: 80 KB, past SLUICE_MAX_REQUEST_BYTES (64 KiB).
    let key = "k".repeat(40 * 1024);
    let h = format!(
        "X-Sluice-Domain: edge\r\nX-Sluice-Descriptor: api_key=@x-api-key, api_key=@x-api-key\r\nX-Api-Key: {key}\r\n"
    );
    let big = get(app.http, &h).await;
    assert!(big.starts_with("http/1.1 400"), "{:.200}", big);
    assert!(big.contains("(sluice_max_request_bytes)"), "{:.300}", big);
    // Copied once it fits the request cap, but makes a counter key past SLUICE_MAX_KEY_BYTES.
    let h = format!(
        "X-Sluice-Domain: edge\r\nX-Sluice-Descriptor: api_key=@x-api-key\r\nX-Api-Key: {key}\r\n"
    );
    let long = get(app.http, &h).await;
    assert!(long.starts_with("http/1.1 400"), "{:.200}", long);
    assert!(long.contains("(sluice_max_key_bytes)"), "{:.300}", long);
}
