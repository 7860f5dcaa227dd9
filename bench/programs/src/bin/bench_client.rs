//! Helpers for `bench/run.sh`: writes h2load request bodies, and checks a server's answers.
//!
//! h2load sends raw bytes and ignores `grpc-status`, so the harness checks correctness with this
//! real gRPC client before it measures anything, and sends each body file h2load will send once
//! as h2load does (`check-body`): a request refused before any handler (routing, framing,
//! decoding) is refused the same way for the same bytes, and the servers' own answer counts,
//! which the harness checks after every load run, never see it.
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
//! # Each body file once, byte for byte, with h2load's method, path and headers; asserts HTTP
//! # 200, grpc-status 0 and a RateLimitResponse.
//! bench_client check-body http://127.0.0.1:8081 FILE...
//! ```

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message;

type Error = Box<dyn std::error::Error>;

const USAGE: &str = "usage: bench_client body OUT DOMAIN key=value[,key=value]...\n       \
                     bench_client check [--headers] URL N LIMIT DOMAIN key=value[,key=value]...\n       \
                     bench_client check-body URL FILE...";

/// The path h2load's requests go to.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

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

/// Sends each file's bytes as one call, as h2load does, and checks the answer is gRPC OK.
async fn check_bodies(url: &str, files: &[String]) -> Result<(), Error> {
    let authority = url
        .strip_prefix("http://")
        .ok_or("the URL must be http://")?;
    let tcp = tokio::net::TcpStream::connect(authority).await?;
    let (client, connection) = h2::client::handshake(tcp).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut codes = Vec::with_capacity(files.len());
    for file in files {
        let body = bytes::Bytes::from(std::fs::read(file)?);
        let request = http::Request::post(format!("{url}{SHOULD_RATE_LIMIT}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("content-length", body.len())
            .body(())?;
        let mut ready = client.clone().ready().await?;
        let (response, mut send) = ready.send_request(request, false)?;
        send.send_data(body, true)?;
        let answer = read_answer(response.await?).await;
        let response = answer.map_err(|e| format!("{file} to {url}: {e}"))?;
        codes.push(Code::try_from(response.overall_code).map_or("?", |c| c.as_str_name()));
    }
    println!(
        "{url}: {} body files as h2load sends them, each answered grpc-status 0 (overall {})",
        files.len(),
        codes.join(", ")
    );
    Ok(())
}

/// The call's answer: HTTP 200, then a message and `grpc-status: 0` in the trailers (a
/// trailers-only answer carries an error's status in its headers).
async fn read_answer(response: http::Response<h2::RecvStream>) -> Result<RateLimitResponse, Error> {
    let status = |h: &http::HeaderMap| {
        let text = |name| {
            h.get(name)
                .map_or("", |v| v.to_str().unwrap_or("?"))
                .to_owned()
        };
        h.contains_key("grpc-status")
            .then(|| (text("grpc-status"), text("grpc-message")))
    };
    if response.status() != http::StatusCode::OK {
        return Err(format!("HTTP status {}", response.status()).into());
    }
    if let Some((code, message)) = status(response.headers()) {
        return Err(format!("grpc-status {code} ({message}), a trailers-only answer").into());
    }
    let mut body = response.into_body();
    let mut message = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        message.extend_from_slice(&chunk);
    }
    match body.trailers().await?.as_ref().and_then(status) {
        Some((code, _)) if code == "0" => {}
        Some((code, message)) => {
            return Err(format!("grpc-status {code} ({message})").into());
        }
        None => return Err("no grpc-status in the trailers".into()),
    }
    match message.split_first_chunk::<5>() {
        Some(([0, len @ ..], rest)) if u32::from_be_bytes(*len) as usize == rest.len() => {
            Ok(RateLimitResponse::decode(rest)?)
        }
        _ => Err(format!("not one uncompressed gRPC message: {} bytes", message.len()).into()),
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
        Some("check-body") if args.len() >= 3 => check_bodies(&args[1], &args[2..]).await,
        _ => Err(USAGE.into()),
    }
}
