//! The load benchmark's comparison server: a measuring instrument, not product code.
//!
//! It does, in one short file (the issue's "70-line DashMap server"), the work Sluice does per
//! descriptor on the memory store: look up a rule (a `HashMap` from the descriptor's keys to a
//! limit, constants matching `bench/config/bench.yaml`), build the counter key in a reused
//! buffer, count a fixed window in a `DashMap<String, AtomicU64>` (read path first; one word holds
//! the window's start and its count, updated by compare-and-swap), and fill full
//! `DescriptorStatus`es, answering OVER_LIMIT when over. Same tonic, envoy-types and tokio as
//! Sluice and `noop_ratelimit`, so Sluice against it shows the gap to what a careful
//! implementation reaches, beside the no-op server's floor.
//! With `headers` it also adds `RateLimit-Limit`, `-Remaining` and `-Reset` from the status with
//! the least remaining, as Sluice does with LIMIT_RESPONSE_HEADERS_ENABLED. No config file, no
//! stats, no eviction: the bench's few keys are all it ever holds. Like Sluice it counts its
//! answers (one add to a counter of the thread's own; `tests/support/src/bench/answers.rs`), served
//! on `--answers ADDR`, so `bench/run.sh` checks every load run's answers were OK.
//!
//! ```sh
//! cargo run --release -p sluice-bench --bin careful_ratelimit -- 127.0.0.1:18082 [headers] \
//!     [--answers 127.0.0.1:18092]
//! ```

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use dashmap::DashMap;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration;
use sluice_test_support::bench::answers::Answers;
use sluice_test_support::bench::serve::serve;

/// bench/config/bench.yaml: `client` alone, and `client` then `route`, at 1e9 per second.
const RULES: [(&str, u32); 2] = [("client", 1_000_000_000), ("client.route", 1_000_000_000)];

struct Careful {
    headers: bool,
    rules: HashMap<&'static str, u32>,
    /// Counter key -> `window start (seconds) << 32 | hits in that window`.
    counters: DashMap<String, AtomicU64>,
    answers: Arc<Answers>,
}

impl Careful {
    /// Adds `hits` to the key's window starting at `window`; returns the window's count after.
    fn count(&self, key: &str, window: u64, hits: u64) -> u64 {
        let add = |word: &AtomicU64| {
            let mut old = word.load(Ordering::Relaxed);
            loop {
                let count = if old >> 32 == window {
                    old & 0xffff_ffff
                } else {
                    0
                };
                let new = (window << 32) | (count + hits).min(0xffff_ffff);
                match word.compare_exchange_weak(old, new, Ordering::AcqRel, Ordering::Relaxed) {
                    Ok(_) => return new & 0xffff_ffff,
                    Err(now) => old = now,
                }
            }
        };
        if let Some(word) = self.counters.get(key) {
            return add(&word);
        }
        add(&self.counters.entry(key.to_owned()).or_default())
    }
}

#[tonic::async_trait]
impl RateLimitService for Careful {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let req = request.into_inner();
        let hits = u64::from(req.hits_addend.max(1));
        // Its own clock read, not Sluice's `clock`: the instrument shares no code with what it measures.
        #[expect(
            clippy::disallowed_methods,
            reason = "a measuring instrument, not Sluice's code"
        )]
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let (mut rule, mut key) = (String::new(), String::new());
        let mut overall = Code::Ok;
        let mut statuses = Vec::with_capacity(req.descriptors.len());
        for descriptor in &req.descriptors {
            rule.clear();
            key.clear();
            let _ = write!(key, "{}_", req.domain);
            for (i, entry) in descriptor.entries.iter().enumerate() {
                rule.push_str(if i == 0 { "" } else { "." });
                rule.push_str(&entry.key);
                let _ = write!(key, "{}_{}_", entry.key, entry.value);
            }
            let Some(&limit) = self.rules.get(rule.as_str()) else {
                statuses.push(DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                });
                continue;
            };
            let count = self.count(&key, now, hits);
            let code = if count > u64::from(limit) {
                Code::OverLimit
            } else {
                Code::Ok
            };
            if code == Code::OverLimit {
                overall = Code::OverLimit;
            }
            statuses.push(DescriptorStatus {
                code: code as i32,
                current_limit: Some(RateLimit {
                    requests_per_unit: limit,
                    unit: Unit::Second as i32,
                    ..Default::default()
                }),
                limit_remaining: u32::try_from(u64::from(limit).saturating_sub(count)).unwrap_or(0),
                duration_until_reset: Some(Duration {
                    seconds: 1,
                    nanos: 0,
                }),
                ..Default::default()
            });
        }
        let response_headers_to_add = rate_limit_headers(self.headers, &statuses);
        self.answers.record(true);
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: overall as i32,
            statuses,
            response_headers_to_add,
            ..Default::default()
        }))
    }
}

/// With `headers`, `RateLimit-Limit`, `-Remaining` and `-Reset` from the status with the least
/// remaining.
fn rate_limit_headers(headers: bool, statuses: &[DescriptorStatus]) -> Vec<HeaderValue> {
    let least = statuses
        .iter()
        .filter(|s| s.current_limit.is_some())
        .min_by_key(|s| s.limit_remaining);
    match least {
        Some(s) if headers => [
            (
                "RateLimit-Limit",
                s.current_limit.as_ref().map_or(0, |l| l.requests_per_unit),
            ),
            ("RateLimit-Remaining", s.limit_remaining),
            ("RateLimit-Reset", 1),
        ]
        .map(|(key, value)| HeaderValue {
            key: key.into(),
            value: value.to_string(),
            ..Default::default()
        })
        .into(),
        _ => Vec::new(),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let addr: SocketAddr = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:18082".into())
        .parse()?;
    let mut service = Careful {
        headers: false,
        rules: RULES.into_iter().collect(),
        counters: DashMap::new(),
        answers: Arc::default(),
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "headers" => service.headers = true,
            "--answers" => {
                let addr = args.next().ok_or("--answers needs an address")?;
                service.answers.serve(addr.parse()?)?;
            }
            _ => return Err(format!("unknown argument {arg:?}").into()),
        }
    }
    serve(addr, service)
}
