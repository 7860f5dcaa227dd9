//! The comparison servers' main loop (`noop_ratelimit`, `careful_ratelimit`): a ratelimit.v3
//! service on `addr`, on the runtime the `sluice` binary builds, until Ctrl-C.

use std::net::SocketAddr;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};

/// Serves `service` on `addr` until Ctrl-C.
pub fn serve<S: RateLimitService>(
    addr: SocketAddr,
    service: S,
) -> Result<(), Box<dyn std::error::Error>> {
    // The same runtime as the `sluice` binary builds.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        tonic::transport::Server::builder()
            .add_service(RateLimitServiceServer::new(service))
            .serve_with_shutdown(addr, async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
    })?;
    Ok(())
}
