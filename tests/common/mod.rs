//! Shared helpers for the socket tests: start Sluice on port 0 with a manual clock, and a tiny
//! HTTP/1.1 client (enough for `/json`, `/healthcheck` and `/rlconfig`).
#![allow(dead_code)]

#[path = "../../integration/support.rs"]
pub mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use sluice::app::{App, AppOptions, Listeners};
use sluice::clock::{ManualClock, Timestamp};
use sluice::config::{ConfigHandle, ConfigSource, LoadOptions, load, parse_files};
use sluice::service::ServiceOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct Running {
    pub http: SocketAddr,
    pub grpc: SocketAddr,
    pub debug: SocketAddr,
    pub clock: ManualClock,
    pub shutdown: Option<oneshot::Sender<()>>,
    pub task: JoinHandle<std::io::Result<()>>,
}

pub fn default_options() -> AppOptions {
    AppOptions {
        service: ServiceOptions::default(),
        max_counters: 100_000,
        max_counter_bytes: 256 << 20,
        counter_reset: false,
        sweep_interval: Duration::from_secs(10),
        max_request_bytes: 64 * 1024,
        require_config_for_health: false,
        shutdown_delay: Duration::ZERO,
        drain_timeout: Duration::from_secs(5),
        reload: None,
        backend: sluice::app::Backend::Memory,
        cluster: None,
        xds: None,
        telemetry: Default::default(),
        grpc_tls: None,
        grpc_connection_age: None,
        listener_limits: Default::default(),
        peer_tls: None,
        quota: Default::default(),
        spoa: None,
        runtime_limits: sluice::app::RuntimeLimitsOptions::default(),
    }
}

/// A config handle serving one YAML file's text, as if loaded from `test.yaml`.
pub fn config_from_yaml(yaml: &str) -> ConfigHandle {
    let cfg = parse_files(
        &[("test.yaml".to_string(), yaml.to_string())],
        &LoadOptions::default(),
    )
    .expect("config loads");
    ConfigHandle::new(Some(cfg))
}

pub fn fixture(path: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(path)
}

/// Starts Sluice with the config at `config_path` (file or directory) and `options`.
pub async fn start(config_path: &std::path::Path, options: AppOptions) -> Running {
    let cfg = load(
        &ConfigSource::Path(config_path.to_path_buf()),
        &LoadOptions::default(),
        &sluice::config::FileLimits::default(),
    )
    .expect("fixture config loads");
    start_with(ConfigHandle::new(Some(cfg)), options).await
}

pub async fn start_with(config: ConfigHandle, options: AppOptions) -> Running {
    // 1_000_000_002: two seconds into a minute, so minute windows don't roll mid-test.
    let clock = ManualClock::new(Timestamp::from_secs(1_000_000_020));
    let listeners = Listeners::ephemeral().await.expect("bind port 0");
    let (http, grpc, debug) = (
        listeners.http.local_addr().unwrap(),
        listeners.grpc.local_addr().unwrap(),
        listeners.debug.local_addr().unwrap(),
    );
    let app = App::new(options, config, Arc::new(clock.clone()))
        .await
        .expect("store starts");
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(app.serve(listeners, async move {
        let _ = rx.await;
    }));
    Running {
        http,
        grpc,
        debug,
        clock,
        shutdown: Some(tx),
        task,
    }
}

pub struct HttpResponse {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

/// One HTTP/1.1 request with `Connection: close`, bounded by a 10 s timeout.
pub async fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> HttpResponse {
    tokio::time::timeout(Duration::from_secs(10), async {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.expect("write");
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.expect("read");
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .expect("status code");
        HttpResponse {
            status,
            headers: head.to_string(),
            body: body.to_string(),
        }
    })
    .await
    .expect("HTTP request finished in time")
}

/// `promtool check metrics` on an exposition; a missing promtool is [`support::missing`] (a
/// failure under the test command and CI).
pub fn promtool_check(text: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        support::missing(
            "promtool",
            "apt-get install prometheus (scripts/test.sh does)",
        );
        return;
    };
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool runs");
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}\n--- exposition ---\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
}
