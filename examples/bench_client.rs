//! Helpers for `bench/run.sh`: writes h2load request bodies, and checks a server's answers.
//!
//! h2load sends raw bytes and ignores `grpc-status`, so the harness checks correctness with this
//! real gRPC client before it measures anything.
//!
//! Each DESCRIPTOR argument is one descriptor, its entries separated by commas
//! (`client=c0,route=r1`); the realistic request is three of them.
//!
//! ```sh
//! # A gRPC-framed ShouldRateLimit body: 0x00, the 4-byte big-endian length, the message.
//! bench_client body OUT DOMAIN DESCRIPTOR...
//! # N calls; asserts every answer is OK with one status per descriptor, each OK with the
//! # expected limit, a remaining count going down by one per call and a time to reset (or, with
//! # LIMIT 0, only an overall OK, as the no-op server answers). With --headers, also the
//! # RateLimit-Limit, -Remaining and -Reset headers of the status with the least remaining.
//! bench_client check [--headers] http://127.0.0.1:8081 N LIMIT DOMAIN DESCRIPTOR...
//! ```

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message;

type Error = Box<dyn std::error::Error>;

const USAGE: &str = "usage: bench_client body OUT DOMAIN key=value[,key=value]...\n       \
                     bench_client check [--headers] URL N LIMIT DOMAIN key=value[,key=value]...";

fn descriptor(entries: &str) -> Result<RateLimitDescriptor, String> {
    let entries = entries
        .split(',')
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
    Ok(RateLimitDescriptor {
        entries,
        ..Default::default()
    })
}

fn request(domain: String, descriptors: &[String]) -> Result<RateLimitRequest, Error> {
    Ok(RateLimitRequest {
        domain,
        descriptors: descriptors
            .iter()
            .map(|d| descriptor(d))
            .collect::<Result<_, _>>()?,
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

async fn check(
    url: String,
    calls: u32,
    limit: u32,
    headers: bool,
    req: RateLimitRequest,
) -> Result<(), Error> {
    let mut client = RateLimitServiceClient::connect(url.clone()).await?;
    let mut last_remaining: Vec<Option<u32>> = vec![None; req.descriptors.len()];
    for i in 0..calls {
        let r = client.should_rate_limit(req.clone()).await?.into_inner();
        if r.overall_code != Code::Ok as i32 {
            return Err(format!("call {i}: overall code {} is not OK", r.overall_code).into());
        }
        if limit == 0 {
            continue;
        }
        if r.statuses.len() != req.descriptors.len() {
            return Err(format!(
                "call {i}: {} statuses, expected {}",
                r.statuses.len(),
                req.descriptors.len()
            )
            .into());
        }
        for (status, last) in r.statuses.iter().zip(&mut last_remaining) {
            check_status(i, limit, status, last)?;
        }
        if headers {
            check_headers(i, limit, &r)?;
        }
    }
    println!("{url}: {calls} calls OK (limit {limit}, last remaining {last_remaining:?})");
    Ok(())
}

/// One descriptor's status: OK, the limit, counted (remaining goes down by one per call unless
/// a window boundary passed), and a time to reset of at most the limit's unit (a second here).
fn check_status(
    i: u32,
    limit: u32,
    status: &DescriptorStatus,
    last: &mut Option<u32>,
) -> Result<(), Error> {
    let got = status.current_limit.as_ref().map(|l| l.requests_per_unit);
    if status.code != Code::Ok as i32 || got != Some(limit) {
        return Err(format!("call {i}: status {status:?}, expected OK with limit {limit}").into());
    }
    let remaining = status.limit_remaining;
    if let Some(last) = *last
        && remaining != last - 1
        && remaining != limit - 1
    {
        return Err(format!("call {i}: remaining {remaining} after {last}").into());
    }
    if remaining >= limit {
        return Err(format!("call {i}: remaining {remaining} is not below {limit}").into());
    }
    match &status.duration_until_reset {
        Some(d) if (0..=1).contains(&d.seconds) => {}
        other => return Err(format!("call {i}: duration until reset {other:?}").into()),
    }
    *last = Some(remaining);
    Ok(())
}

/// RateLimit-Limit, -Remaining and -Reset, from the status with the least remaining.
fn check_headers(i: u32, limit: u32, r: &RateLimitResponse) -> Result<(), Error> {
    let least = r.statuses.iter().map(|s| s.limit_remaining).min();
    let got: Vec<(&str, &str)> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    let (limit, least) = (limit.to_string(), least.unwrap_or(0).to_string());
    match got.as_slice() {
        [
            ("RateLimit-Limit", l),
            ("RateLimit-Remaining", rem),
            ("RateLimit-Reset", reset),
        ] if *l == limit && *rem == least && matches!(*reset, "0" | "1") => Ok(()),
        _ => Err(
            format!("call {i}: headers {got:?}, expected limit {limit}, remaining {least}").into(),
        ),
    }
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
            let headers = args[1] == "--headers";
            let args = &args[usize::from(headers)..];
            if args.len() < 5 {
                return Err(USAGE.into());
            }
            let calls: u32 = args[2].parse()?;
            let limit: u32 = args[3].parse()?;
            let req = request(args[4].clone(), &args[5..])?;
            check(args[1].clone(), calls, limit, headers, req).await
        }
        _ => Err(USAGE.into()),
    }
}
