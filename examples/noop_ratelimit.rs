//! The load benchmark's baseline: a `ratelimit.v3` server that answers every `ShouldRateLimit`
//! with `{overall_code: OK}` and does no work at all.
//!
//! It is built from the same tonic, envoy-types and tokio as Sluice, with the same runtime (tokio's
//! multi-threaded default) and the same `tonic::transport::Server` defaults, so the difference
//! between the two under the same load is what Sluice's own work costs.
//!
//! ```sh
//! cargo run --release --example noop_ratelimit -- 127.0.0.1:18081
//! ```

use std::net::SocketAddr;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

struct Noop;

#[tonic::async_trait]
impl RateLimitService for Noop {
    async fn should_rate_limit(
        &self,
        _request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..Default::default()
        }))
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr: SocketAddr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:18081".into())
        .parse()?;
    // The same runtime as the `sluice` binary builds.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        tonic::transport::Server::builder()
            .add_service(RateLimitServiceServer::new(Noop))
            .serve_with_shutdown(addr, async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
    })?;
    Ok(())
}
