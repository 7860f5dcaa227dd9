//! Helpers for `bench/run.sh`: writes h2load request bodies, and checks a server's answers.
//!
//! h2load sends raw bytes and ignores `grpc-status`, so the harness checks correctness with this
//! real gRPC client before it measures anything.
//!
//! ```sh
//! # A gRPC-framed ShouldRateLimit body: 0x00, the 4-byte big-endian length, the message.
//! bench_client body OUT DOMAIN key=value...
//! # N calls on one descriptor; asserts every answer is OK with the expected limit and
//! # remaining count (or, with LIMIT 0, only an overall OK, as the no-op server answers).
//! bench_client check http://127.0.0.1:8081 N LIMIT DOMAIN key=value...
//! ```

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use prost::Message;

type Error = Box<dyn std::error::Error>;

const USAGE: &str = "usage: bench_client body OUT DOMAIN key=value...\n       \
                     bench_client check URL N LIMIT DOMAIN key=value...";

fn request(domain: String, pairs: &[String]) -> Result<RateLimitRequest, Error> {
    let entries = pairs
        .iter()
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
    Ok(RateLimitRequest {
        domain,
        descriptors: vec![RateLimitDescriptor {
            entries,
            ..Default::default()
        }],
        hits_addend: 1,
    })
}

/// The gRPC length-prefixed message: no compression flag, then the big-endian length.
fn grpc_frame(message: &RateLimitRequest) -> Vec<u8> {
    let body = message.encode_to_vec();
    let mut framed = Vec::with_capacity(5 + body.len());
    framed.push(0);
    framed.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_be_bytes());
    framed.extend_from_slice(&body);
    framed
}

async fn check(url: String, calls: u32, limit: u32, req: RateLimitRequest) -> Result<(), Error> {
    let mut client = RateLimitServiceClient::connect(url.clone()).await?;
    let mut last_remaining = None;
    for i in 0..calls {
        let r = client.should_rate_limit(req.clone()).await?.into_inner();
        if r.overall_code != Code::Ok as i32 {
            return Err(format!("call {i}: overall code {} is not OK", r.overall_code).into());
        }
        if limit == 0 {
            continue;
        }
        let [status] = r.statuses.as_slice() else {
            return Err(format!("call {i}: {} statuses, expected 1", r.statuses.len()).into());
        };
        let got = status.current_limit.as_ref().map(|l| l.requests_per_unit);
        if status.code != Code::Ok as i32 || got != Some(limit) {
            return Err(
                format!("call {i}: status {status:?}, expected OK with limit {limit}").into(),
            );
        }
        // Counted: remaining goes down by one per call, unless a window boundary passed.
        let remaining = status.limit_remaining;
        if let Some(last) = last_remaining
            && remaining != last - 1
            && remaining != limit - 1
        {
            return Err(format!("call {i}: remaining {remaining} after {last}").into());
        }
        if remaining >= limit {
            return Err(format!("call {i}: remaining {remaining} is not below {limit}").into());
        }
        last_remaining = Some(remaining);
    }
    println!("{url}: {calls} calls OK (limit {limit}, last remaining {last_remaining:?})");
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("body") if args.len() >= 3 => {
            let req = request(args[2].clone(), &args[3..])?;
            std::fs::write(&args[1], grpc_frame(&req))?;
            Ok(())
        }
        Some("check") if args.len() >= 5 => {
            let calls: u32 = args[2].parse()?;
            let limit: u32 = args[3].parse()?;
            let req = request(args[4].clone(), &args[5..])?;
            check(args[1].clone(), calls, limit, req).await
        }
        _ => Err(USAGE.into()),
    }
}
