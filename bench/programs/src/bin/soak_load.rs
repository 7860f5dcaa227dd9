//! The soak's client (`bench/soak.py`): steady gRPC, `/json` and `/nginx` load, and probes that
//! hit one key a known number of times and count what was admitted.
//!
//! h2load ignores `grpc-status` and answers alone say nothing about the config a node loaded, so
//! this client classifies every answer: `ok` (allowed, and a limit matched), `unmatched` (allowed
//! with no limit: the descriptor matched nothing), `over`, or the error (`grpc_unknown`,
//! `grpc_unavailable`, `http_400`, `http_500`, `connect`, `timeout`, ...).
//!
//! ```sh
//! # Open-loop load for SECONDS over USERS distinct `user` values, each TARGET at its own rate:
//! # one line per request on stdout, `unix_ms,kind,name,outcome,latency_us` (unix_ms: when it
//! # was sent).
//! # SECONDS 0: until SIGINT. Either way, calls in flight are waited for.
//! soak_load load SECONDS USERS KIND,NAME,URL,RATE...
//! # HITS calls for descriptor probe=VALUE, in turn over the TARGETs, one at a time; prints one
//! # JSON line: {"ok": .., "over": .., "errors": {..}, "first_ms": .., "last_ms": ..}.
//! soak_load probe VALUE HITS KIND,NAME,URL...
//! ```
//!
//! KIND is `grpc` (URL `http://host:port`), `json` (URL `http://host:port/json`) or `nginx` (URL
//! of an nginx location whose `auth_request` asks Sluice's `/nginx` with
//! `X-Sluice-Descriptor: user=@x-user, probe=@x-probe`). The domain is `soak`.
//!
//! Load is open loop: each target sends on its own clock, whatever earlier calls are doing, so a
//! stalled server shows as slow answers rather than as fewer requests (no coordinated omission).

#![allow(
    clippy::disallowed_methods,
    reason = "a benchmark's or load generator's own stopwatch, outside Sluice"
)]
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sluice_test_support::bench::rng::mix;
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};

type Error = Box<dyn std::error::Error + Send + Sync>;
type Http = Client<HttpConnector, Full<Bytes>>;

const USAGE: &str = "usage: soak_load load SECONDS USERS KIND,NAME,URL,RATE...\n       \
                     soak_load probe VALUE HITS KIND,NAME,URL...";
const DOMAIN: &str = "soak";
/// How long a call may take before the client gives up on it: well past every deadline Sluice
/// sets itself (REDIS_TIMEOUT, SLUICE_PEER_TIMEOUT_MS, SLUICE_REQUEST_TIMEOUT_MS's 5 s), so a
/// slow answer is measured rather than cut short.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(6);
/// Set by SIGINT: the load stops sending, waits for its calls in flight and flushes its lines.
static STOP: AtomicBool = AtomicBool::new(false);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Grpc,
    Json,
    Nginx,
}

/// Where calls go: a kind, a name for the report, and how to reach it.
#[derive(Clone)]
struct Target {
    kind: Kind,
    name: String,
    url: String,
    grpc: Option<Channel>,
    http: Http,
}

/// One request's descriptor: a load `user`, or a `probe` key.
#[derive(Clone, Copy)]
enum Ask<'a> {
    User(u64),
    Probe(&'a str),
}

impl Target {
    fn parse(spec: &str, http: &Http) -> Result<(Target, Option<f64>), Error> {
        let mut parts = spec.split(',');
        let (Some(kind), Some(name), Some(url)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!("{spec:?} is not KIND,NAME,URL[,RATE]").into());
        };
        let rate = parts.next().map(str::parse::<f64>).transpose()?;
        let kind = match kind {
            "grpc" => Kind::Grpc,
            "json" => Kind::Json,
            "nginx" => Kind::Nginx,
            other => return Err(format!("{other:?} is not grpc, json or nginx").into()),
        };
        // Lazy: a target that is down at start (or killed later) reconnects on its next call.
        let grpc = (kind == Kind::Grpc).then(|| {
            Endpoint::from_shared(url.to_string()).map(|e| {
                e.connect_timeout(Duration::from_secs(1))
                    .tcp_nodelay(true)
                    .connect_lazy()
            })
        });
        let target = Target {
            kind,
            name: name.into(),
            url: url.into(),
            grpc: grpc.transpose()?,
            http: http.clone(),
        };
        Ok((target, rate))
    }

    /// One call; the outcome's name (see the module doc).
    async fn call(&self, ask: Ask<'_>) -> String {
        let answer = match self.kind {
            Kind::Grpc => tokio::time::timeout(CLIENT_TIMEOUT, self.grpc_call(ask)).await,
            Kind::Json | Kind::Nginx => {
                tokio::time::timeout(CLIENT_TIMEOUT, self.http_call(ask)).await
            }
        };
        answer.unwrap_or_else(|_| "timeout".into())
    }

    async fn grpc_call(&self, ask: Ask<'_>) -> String {
        let channel = self.grpc.clone().expect("a gRPC target has a channel");
        let (key, value) = match ask {
            Ask::User(u) => ("user", u.to_string()),
            Ask::Probe(v) => ("probe", v.to_string()),
        };
        let request = RateLimitRequest {
            domain: DOMAIN.into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: key.into(),
                    value,
                }],
                ..Default::default()
            }],
            hits_addend: 1,
        };
        match RateLimitServiceClient::new(channel)
            .should_rate_limit(request)
            .await
        {
            Ok(r) => {
                let r = r.into_inner();
                let matched = r.statuses.iter().any(|s| s.current_limit.is_some());
                match Code::try_from(r.overall_code) {
                    Ok(Code::OverLimit) => "over".into(),
                    Ok(Code::Ok) if matched => "ok".into(),
                    Ok(Code::Ok) => "unmatched".into(),
                    _ => format!("code_{}", r.overall_code),
                }
            }
            Err(status) => format!("grpc_{:?}", status.code()).to_lowercase(),
        }
    }

    async fn http_call(&self, ask: Ask<'_>) -> String {
        let builder = hyper::Request::builder().uri(&self.url);
        let request = match (self.kind, ask) {
            (Kind::Json, ask) => {
                let (key, value) = match ask {
                    Ask::User(u) => ("user", u.to_string()),
                    Ask::Probe(v) => ("probe", v.to_string()),
                };
                let body = serde_json::json!({"domain": DOMAIN, "descriptors": [
                    {"entries": [{"key": key, "value": value}]}]});
                builder
                    .method("POST")
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(body.to_string())))
            }
            (_, Ask::User(u)) => builder.header("x-user", u).body(Full::default()),
            (_, Ask::Probe(v)) => builder.header("x-probe", v).body(Full::default()),
        };
        let response = match self.http.request(request.expect("a valid request")).await {
            Ok(r) => r,
            Err(e) if e.is_connect() => return "connect".into(),
            Err(_) => return "http_error".into(),
        };
        let status = response.status().as_u16();
        // Allowed with a matched limit: /json names it in the body, /nginx (through nginx) in
        // the RateLimit-Limit header the example config copies onto the answer.
        let limited = response
            .headers()
            .get("ratelimit-limit")
            .is_some_and(|v| !v.is_empty());
        let body = match response.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => return "http_error".into(),
        };
        let matched = match self.kind {
            Kind::Json => body.windows(12).any(|w| w == b"currentLimit"),
            _ => limited,
        };
        match status {
            200 if matched => "ok".into(),
            200 => "unmatched".into(),
            429 => "over".into(),
            other => format!("http_{other}"),
        }
    }
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

fn http_client() -> Http {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(1)));
    // Idle connections are dropped well before Sluice's own idle timeout (300 s) would close
    // them under a request.
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector)
}

/// Sends to `target` at `rate` per second for `seconds`, each answer's line to `lines`.
async fn drive(
    target: Target,
    rate: f64,
    seconds: f64,
    users: u64,
    seed: u64,
    lines: mpsc::UnboundedSender<String>,
) {
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    // A client starved of CPU sends late rather than in a burst that would look like load.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut calls = Vec::new();
    for i in 0u64.. {
        ticker.tick().await;
        if Instant::now() >= end || STOP.load(Ordering::Relaxed) {
            break;
        }
        let (target, lines) = (target.clone(), lines.clone());
        let user = mix(seed ^ i) % users;
        calls.push(tokio::spawn(async move {
            let (sent, start) = (unix_ms(), Instant::now());
            let outcome = target.call(Ask::User(user)).await;
            let took = start.elapsed().as_micros();
            let kind = format!("{:?}", target.kind).to_lowercase();
            let _ = lines.send(format!("{sent},{kind},{},{outcome},{took}\n", target.name));
        }));
        if calls.len() >= 4096 {
            calls.retain(|c| !c.is_finished());
        }
    }
    for call in calls {
        let _ = call.await;
    }
}

async fn load(args: &[String]) -> Result<(), Error> {
    let [seconds, users, specs @ ..] = args else {
        return Err(USAGE.into());
    };
    let (seconds, users): (f64, u64) = (seconds.parse()?, users.parse()?);
    // 0: until SIGINT, for a run whose length its caller decides as it goes.
    let seconds = if seconds > 0.0 { seconds } else { 1e9 };
    tokio::spawn(async {
        if tokio::signal::ctrl_c().await.is_ok() {
            STOP.store(true, Ordering::Relaxed);
        }
    });
    let http = http_client();
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    let mut drivers = Vec::new();
    for (n, spec) in specs.iter().enumerate() {
        let (target, rate) = Target::parse(spec, &http)?;
        let rate = rate.ok_or(format!("{spec:?}: no RATE"))?;
        let seed = mix(n as u64 + 1);
        drivers.push(tokio::spawn(drive(
            target,
            rate,
            seconds,
            users.max(1),
            seed,
            tx.clone(),
        )));
    }
    drop(tx);
    let writer = tokio::task::spawn_blocking(move || {
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        while let Some(line) = rx.blocking_recv() {
            out.write_all(line.as_bytes())?;
        }
        out.flush()
    });
    for d in drivers {
        d.await?;
    }
    writer.await??;
    Ok(())
}

async fn probe(args: &[String]) -> Result<(), Error> {
    let [value, hits, specs @ ..] = args else {
        return Err(USAGE.into());
    };
    let hits: usize = hits.parse()?;
    let http = http_client();
    let targets = specs
        .iter()
        .map(|s| Target::parse(s, &http).map(|(t, _)| t))
        .collect::<Result<Vec<_>, _>>()?;
    if targets.is_empty() {
        return Err(USAGE.into());
    }
    let (mut ok, mut over) = (0u32, 0u32);
    let mut errors = BTreeMap::<String, u32>::new();
    let first_ms = unix_ms();
    for target in targets.iter().cycle().take(hits) {
        match target.call(Ask::Probe(value)).await.as_str() {
            "ok" => ok += 1,
            "over" => over += 1,
            other => {
                *errors
                    .entry(format!("{}:{other}", target.name))
                    .or_default() += 1
            }
        }
    }
    let report = serde_json::json!({"value": value, "hits": hits, "ok": ok, "over": over,
        "errors": errors, "first_ms": first_ms as u64, "last_ms": unix_ms() as u64});
    println!("{report}");
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("load") => load(&args[1..]).await,
        Some("probe") => probe(&args[1..]).await,
        _ => Err(USAGE.into()),
    }
}
