//! Calls a running Sluice over gRPC, the way Envoy's ratelimit filter does, and prints the answer.
//!
//! ```sh
//! cargo run --release                                   # in one shell: Sluice on config/
//! cargo run --example should_rate_limit -- edge remote_address=10.0.0.1
//! ```
//!
//! Arguments: a domain, then `key=value` entries of one descriptor. SLUICE_GRPC (default
//! `http://127.0.0.1:8081`) says where Sluice listens.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let domain = args
        .next()
        .ok_or("usage: should_rate_limit DOMAIN key=value...")?;
    let entries = args
        .map(|kv| {
            let (key, value) = kv
                .split_once('=')
                .ok_or(format!("{kv:?} is not key=value"))?;
            Ok(Entry {
                key: key.into(),
                value: value.into(),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let addr = std::env::var("SLUICE_GRPC").unwrap_or_else(|_| "http://127.0.0.1:8081".into());
    let mut client = RateLimitServiceClient::connect(addr).await?;
    let response = client
        .should_rate_limit(RateLimitRequest {
            domain,
            descriptors: vec![RateLimitDescriptor {
                entries,
                ..Default::default()
            }],
            hits_addend: 1,
        })
        .await?
        .into_inner();
    let code = |c: i32| Code::try_from(c).map_or("?", |c| c.as_str_name());
    println!("overall: {}", code(response.overall_code));
    for s in response.statuses {
        let limit = s
            .current_limit
            .map(|l| format!("{} per unit {}", l.requests_per_unit, l.unit))
            .unwrap_or_else(|| "no limit".into());
        println!(
            "  {} ({limit}), remaining {}, resets in {}s",
            code(s.code),
            s.limit_remaining,
            s.duration_until_reset.map_or(0, |d| d.seconds)
        );
    }
    Ok(())
}
