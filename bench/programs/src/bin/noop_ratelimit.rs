//! The load benchmark's baseline: a `ratelimit.v3` server that answers every `ShouldRateLimit`
//! with `{overall_code: OK}` and does no work at all.
//!
//! It is built from the same tonic, envoy-types and tokio as Sluice, with the same runtime (tokio's
//! multi-threaded default) and the same `tonic::transport::Server` defaults, so the difference
//! between the two under the same load is what Sluice's own work costs. Like Sluice it counts its
//! answers (one add to a counter of the thread's own; `tests/support/src/bench/answers.rs`), served
//! on `--answers ADDR`, so `bench/run.sh` checks every load run's answers were OK.
//!
//! `--unavailable-after N` plants a failing server for `bench/selftest.sh`: its first N calls are
//! answered OK (enough for the checks before the load), every later one UNAVAILABLE, at full
//! speed. The benchmark must refuse it.
//!
//! ```sh
//! cargo run --release -p sluice-bench --bin noop_ratelimit -- 127.0.0.1:18081 [--answers 127.0.0.1:18091]
//!     [--unavailable-after 100]
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sluice_test_support::bench::answers::Answers;
use sluice_test_support::bench::serve::serve;

struct Noop {
    answers: Arc<Answers>,
    /// `--unavailable-after`: the calls answered OK before every call fails.
    unavailable_after: Option<u64>,
    calls: AtomicU64,
}

#[tonic::async_trait]
impl RateLimitService for Noop {
    async fn should_rate_limit(
        &self,
        _request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        if let Some(after) = self.unavailable_after
            && self.calls.fetch_add(1, Ordering::Relaxed) >= after
        {
            self.answers.record(false);
            return Err(tonic::Status::unavailable(
                "a planted failure (noop_ratelimit --unavailable-after)",
            ));
        }
        self.answers.record(true);
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..Default::default()
        }))
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let addr: SocketAddr = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:18081".into())
        .parse()?;
    let mut noop = Noop {
        answers: Arc::default(),
        unavailable_after: None,
        calls: AtomicU64::new(0),
    };
    while let Some(arg) = args.next() {
        let value = args.next().ok_or(format!("{arg} needs a value"))?;
        match arg.as_str() {
            "--answers" => noop.answers.serve(value.parse()?)?,
            "--unavailable-after" => noop.unavailable_after = Some(value.parse()?),
            _ => return Err(format!("unknown argument {arg:?}").into()),
        }
    }
    serve(addr, noop)
}
