//! Sluice in this process, for the socket tests of `tests/`: started on port 0 with a manual
//! clock, from a fixture or from YAML text. (Their HTTP client is [`crate::http::http_async`].)

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use sluice::app::{App, AppOptions, Listeners};
use sluice::clock::{ManualClock, Timestamp};
use sluice::config::{ConfigHandle, ConfigSource, LoadOptions, load, parse_files};
use sluice::service::ServiceOptions;
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
    crate::process::repo().join("tests/fixtures").join(path)
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
