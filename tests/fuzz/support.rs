//! What every target shares: its proptest configuration (case count, regression file), the slow
//! case check, and a rate-limit service over a real memory store to run decoded requests through.

#![allow(
    clippy::disallowed_methods,
    reason = "tests time real processes, sockets and deadlines; Sluice's code reads time through crate::clock"
)]
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use proptest::test_runner::{Config, FileFailurePersistence};
use sluice::api::health::Health;
use sluice::clock::{ManualClock, Timestamp};
use sluice::config::{ConfigHandle, LoadOptions, parse_files};
use sluice::service::{HeaderNames, RateLimitService, ServiceOptions};
use sluice::store::MemoryStore;
use tonic::codegen::Service;

/// A target's configuration: `cases` per property unless PROPTEST_CASES says otherwise, failures
/// saved in `regressions` (a path below the package root, where cargo runs tests).
pub fn proptest_config(cases: u32, regressions: &'static str) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(regressions))),
        ..Config::default()
    }
}

/// The time one case may take: FUZZ_SLOW_MS, default 5 s (generous for a debug build on a busy
/// CI machine; every case here normally takes well under 10 ms).
fn slow_limit() -> Duration {
    let ms = std::env::var("FUZZ_SLOW_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000);
    Duration::from_millis(ms)
}

/// Runs one case and fails it if it took longer than [`slow_limit`]: unbounded work on a small
/// input is a finding even when the answer is right.
pub fn timed<T>(what: &str, case: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = case();
    let took = started.elapsed();
    let limit = slow_limit();
    assert!(
        took <= limit,
        "{what}: one case took {took:?} (FUZZ_SLOW_MS allows {limit:?})"
    );
    out
}

/// Load options with MERGE_DOMAIN_CONFIG as given (the one place to touch when options are
/// added).
pub fn load_options(merge_domain_config: bool) -> LoadOptions {
    LoadOptions {
        merge_domain_config,
        without_slots: None,
        calendar_month: false,
    }
}

/// A config for the service targets: a plain limit, a nested one, a wildcard with
/// `share_threshold`, every algorithm, an unlimited entry and metadata, so decoded requests reach
/// every kind of rule.
pub const SERVICE_CONFIG: &str = r#"
domain: d
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: k
    value: v
    rate_limit: {unit: minute, requests_per_unit: 5, name: kv}
    metadata: {tier: gold, n: 2}
    descriptors:
      - key: n
        rate_limit: {unit: hour, requests_per_unit: 7, replaces: [{name: kv}]}
  - key: w
    value: a*
    share_threshold: true
    detailed_metric: true
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: free
    rate_limit: {unlimited: true}
  - key: multi
    rate_limits:
      - {unit: second, requests_per_unit: 4, algorithm: sliding_window}
      - {unit: minute, requests_per_unit: 9, algorithm: token_bucket, burst: 3}
      - {unit: hour, requests_per_unit: 20, algorithm: leaky_bucket, burst: 2}
  - key: q
    quota_mode: true
    shadow_mode: true
    rate_limit: {unit: week, requests_per_unit: 1}
"#;

/// The domain of [`SERVICE_CONFIG`]; generators use it often so requests match.
pub const SERVICE_DOMAIN: &str = "d";

/// A service over a memory store with room for `max_counters` counters, answering with
/// `RateLimit-*` headers and dynamic metadata so that encoding has every field to write.
pub fn service(max_counters: usize) -> Arc<RateLimitService<MemoryStore>> {
    let cfg = parse_files(
        &[("service.yaml".to_owned(), SERVICE_CONFIG.to_owned())],
        &LoadOptions::default(),
    )
    .expect("SERVICE_CONFIG loads");
    let clock = ManualClock::new(Timestamp::from_secs(1_700_000_000));
    let options = ServiceOptions {
        response_headers: Some(HeaderNames::default()),
        dynamic_metadata: true,
        ..ServiceOptions::default()
    };
    Arc::new(RateLimitService::new(
        ConfigHandle::new(Some(cfg)),
        Arc::new(MemoryStore::new(max_counters)),
        Arc::new(clock),
        options,
    ))
}

/// A single-threaded runtime for the targets that call async code: each case blocks on it.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// PORT's router (`/json`, `/nginx`, `/healthcheck`) over `service`, with a body cap of
/// `max_request_bytes`, as the app builds it.
pub fn http_router(
    service: Arc<RateLimitService<MemoryStore>>,
    max_request_bytes: usize,
) -> axum::Router {
    let health = Arc::new(Health::new(
        service.config().clone(),
        false,
        tokio::sync::watch::channel(true).1,
    ));
    sluice::api::http::router(service, health, max_request_bytes)
}

/// One HTTP exchange with `router`, in process: the status, headers and whole body.
pub async fn exchange(
    router: &mut axum::Router,
    request: axum::http::Request<axum::body::Body>,
) -> (StatusCode, HeaderMap, Vec<u8>) {
    let response = router
        .call(request)
        .await
        .expect("axum routers are infallible");
    let (parts, body) = response.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .expect("an in-memory body");
    (parts.status, parts.headers, body.to_vec())
}

/// The byte between the parts of one cargo-fuzz input, for the targets that take several
/// (config files, xDS resources).
const PART_SEPARATOR: u8 = 0;

/// The parts of one cargo-fuzz input, at most `max` (the last keeps any further separators).
pub fn fuzz_parts(data: &[u8], max: usize) -> impl Iterator<Item = &[u8]> {
    data.splitn(max, |b| *b == PART_SEPARATOR)
}

/// A cargo-fuzz input of a flags byte and `parts`, as the raw-bytes properties hand it to a
/// target's `check_fuzz_input`.
pub fn fuzz_input(flags: u8, parts: &[Vec<u8>]) -> Vec<u8> {
    let mut input = vec![flags];
    input.extend(parts.join(&PART_SEPARATOR));
    input
}
