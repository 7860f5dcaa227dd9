//! The high-cardinality benchmark's client (`bench/lease_keys.py`, issue 49): gRPC
//! ShouldRateLimit calls of many descriptors each, one distinct `user` per descriptor, over
//! many users, the calls spread over the nodes in turn as a per-request load balancer does.
//!
//! ```sh
//! # Every user u0 .. u<USERS-1> once, PER_REQUEST users a call, as fast as CONCURRENCY calls
//! # in flight go (the users' first hits: in lease mode, every node's acquires).
//! keys_load touch URLS USERS [--per-request 40] [--concurrency 8] [--top 10]
//! # Calls for SECS seconds, RATE a second (fewer when the nodes cannot keep up: a late call
//! # is sent at once, never dropped), each of PER_REQUEST distinct users drawn with Zipf(S)
//! # popularity over the USERS (u0 the hottest); counts what the TOP hottest users were
//! # offered and admitted, per hour (per --window-secs).
//! keys_load zipf URLS USERS --secs SECS --rate RATE [--zipf 1.1] [--per-request 40]
//!     [--concurrency 32] [--top 10] [--seed 1] [--window-secs 3600]
//! ```
//!
//! URLS is a comma-separated list of `http://host:port` gRPC addresses; the domain is `keys`.
//! Prints one JSON line: calls, decisions (one per descriptor), admitted, over, failed calls
//! (and the first failure), seconds, decisions per target, and the TOP (10) hottest users'
//! `[rank, hour, offered, admitted]` (with `touch`, their first hits). Exits 1 when a call fails or an answer does not carry one
//! status per descriptor.

#![allow(
    clippy::disallowed_methods,
    reason = "a load generator's own stopwatch, outside Sluice"
)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice_test_support::bench::rng::SplitMix64 as Rng;
use tonic::transport::{Channel, Endpoint};

type Error = Box<dyn std::error::Error + Send + Sync>;

const USAGE: &str = "usage: keys_load touch URLS USERS [--per-request N] [--concurrency N] \
                     [--top N]\n       \
                     keys_load zipf URLS USERS --secs S --rate R [--zipf S] [--per-request N] \
                     [--concurrency N] [--top N] [--seed N] [--window-secs N]";
const DOMAIN: &str = "keys";
/// Past every deadline Sluice sets itself (SLUICE_REQUEST_TIMEOUT_MS's 5 s): a slow answer is
/// measured, a lost one fails the run.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The command line.
struct Options {
    zipf_load: bool,
    urls: Vec<String>,
    users: u64,
    per_request: usize,
    concurrency: usize,
    secs: f64,
    rate: f64,
    zipf: f64,
    top: u64,
    seed: u64,
    /// The limit's window (`--window-secs`, 3600): what offered and admitted are counted per.
    window_secs: u64,
}

impl Options {
    fn parse(args: &[String]) -> Result<Self, Error> {
        let [command, urls, users, rest @ ..] = args else {
            return Err(USAGE.into());
        };
        let flag = |name: &str| -> Result<Option<f64>, Error> {
            match rest.iter().position(|a| a == name) {
                Some(i) => {
                    let v = rest.get(i + 1).ok_or(format!("{name} takes a value"))?;
                    Ok(Some(v.parse().map_err(|_| format!("{name} {v:?}"))?))
                }
                None => Ok(None),
            }
        };
        let zipf_load = match command.as_str() {
            "touch" => false,
            "zipf" => true,
            _ => return Err(USAGE.into()),
        };
        let o = Options {
            zipf_load,
            urls: urls.split(',').map(str::to_owned).collect(),
            users: users.parse()?,
            per_request: flag("--per-request")?.unwrap_or(40.0) as usize,
            concurrency: flag("--concurrency")?.unwrap_or(if zipf_load { 32.0 } else { 8.0 })
                as usize,
            secs: flag("--secs")?.unwrap_or(0.0),
            rate: flag("--rate")?.unwrap_or(0.0),
            zipf: flag("--zipf")?.unwrap_or(1.1),
            top: flag("--top")?.unwrap_or(10.0) as u64,
            seed: flag("--seed")?.unwrap_or(1.0) as u64,
            window_secs: flag("--window-secs")?.unwrap_or(3600.0) as u64,
        };
        if o.per_request == 0 || o.users < o.per_request as u64 || o.concurrency == 0 {
            return Err("USERS must be at least --per-request, both above 0".into());
        }
        if o.zipf_load && (o.secs <= 0.0 || o.rate <= 0.0) {
            return Err("zipf needs --secs and --rate".into());
        }
        Ok(o)
    }
}

/// Zipf(s) over ranks 0 .. n (rank 0 the most popular), by its cumulative distribution.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: u64, s: f64) -> Self {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|r| {
                acc += (r as f64).powf(-s);
                acc
            })
            .collect();
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    fn sample(&self, rng: &mut Rng) -> u64 {
        let u = rng.unit();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1) as u64
    }
}

/// What one worker (or the whole run) saw.
#[derive(Default)]
struct Tally {
    calls: u64,
    decisions: u64,
    admitted: u64,
    over: u64,
    failed: u64,
    first_failure: Option<String>,
    per_target: Vec<u64>,
    /// (rank, hour) -> (offered, admitted), for the hottest users.
    top: BTreeMap<(u64, u64), (u64, u64)>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.calls += other.calls;
        self.decisions += other.decisions;
        self.admitted += other.admitted;
        self.over += other.over;
        self.failed += other.failed;
        self.first_failure = self.first_failure.take().or(other.first_failure);
        self.per_target
            .resize(other.per_target.len().max(self.per_target.len()), 0);
        for (mine, theirs) in self.per_target.iter_mut().zip(other.per_target) {
            *mine += theirs;
        }
        for (k, (o, a)) in other.top {
            let e = self.top.entry(k).or_default();
            e.0 += o;
            e.1 += a;
        }
    }
}

/// What every worker shares: the targets, the next call's number, the run's shape.
struct Run {
    o: Options,
    channels: Vec<Channel>,
    next: AtomicU64,
    zipf: Option<Zipf>,
    start: Instant,
}

fn request(users: &[u64]) -> RateLimitRequest {
    RateLimitRequest {
        domain: DOMAIN.into(),
        descriptors: users
            .iter()
            .map(|u| RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".into(),
                    value: format!("u{u}"),
                }],
                ..Default::default()
            })
            .collect(),
        hits_addend: 1,
    }
}

/// The index of the limit's window now (`window_secs` long).
fn window_now(window_secs: u64) -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / window_secs.max(1))
}

impl Run {
    /// The users of call `j`, or `None` when the run is over.
    fn users_of(&self, j: u64, rng: &mut Rng, out: &mut Vec<u64>) -> Option<()> {
        out.clear();
        let per = self.o.per_request as u64;
        let Some(zipf) = &self.zipf else {
            let first = j.checked_mul(per).filter(|&f| f < self.o.users)?;
            out.extend(first..(first + per).min(self.o.users));
            return Some(());
        };
        if j as f64 >= self.o.secs * self.o.rate {
            return None;
        }
        while out.len() < self.o.per_request {
            let u = zipf.sample(rng);
            if !out.contains(&u) {
                out.push(u);
            }
        }
        Some(())
    }

    /// Waits until call `j` is due (zipf: `j / rate` seconds after the start).
    async fn pace(&self, j: u64) {
        if self.zipf.is_some() {
            let due = self.start + Duration::from_secs_f64(j as f64 / self.o.rate);
            tokio::time::sleep_until(due.into()).await;
        }
    }

    async fn worker(self: Arc<Self>, index: u64) -> Tally {
        let mut rng = Rng(self.o.seed.wrapping_mul(0x1000_0001).wrapping_add(index));
        let mut tally = Tally {
            per_target: vec![0; self.channels.len()],
            ..Tally::default()
        };
        let mut users = Vec::with_capacity(self.o.per_request);
        loop {
            let j = self.next.fetch_add(1, Ordering::Relaxed);
            if self.users_of(j, &mut rng, &mut users).is_none() {
                return tally;
            }
            self.pace(j).await;
            let target = (j % self.channels.len() as u64) as usize;
            self.call(target, &users, &mut tally).await;
        }
    }

    async fn call(&self, target: usize, users: &[u64], tally: &mut Tally) {
        tally.calls += 1;
        let mut client = RateLimitServiceClient::new(self.channels[target].clone());
        let hour = window_now(self.o.window_secs);
        let answer = tokio::time::timeout(CALL_TIMEOUT, client.should_rate_limit(request(users)));
        let statuses = match answer.await {
            Ok(Ok(r)) => r.into_inner().statuses,
            Ok(Err(status)) => return tally.fail(format!("{target}: {status}")),
            Err(_) => return tally.fail(format!("{target}: no answer in {CALL_TIMEOUT:?}")),
        };
        if statuses.len() != users.len() {
            let n = statuses.len();
            return tally.fail(format!("{target}: {n} statuses for {} users", users.len()));
        }
        for (&user, status) in users.iter().zip(&statuses) {
            let admitted = status.code == Code::Ok as i32;
            tally.decisions += 1;
            tally.per_target[target] += 1;
            tally.admitted += u64::from(admitted);
            tally.over += u64::from(status.code == Code::OverLimit as i32);
            if user < self.o.top {
                let e = tally.top.entry((user, hour)).or_default();
                e.0 += 1;
                e.1 += u64::from(admitted);
            }
        }
    }
}

impl Tally {
    fn fail(&mut self, why: String) {
        self.failed += 1;
        self.first_failure.get_or_insert(why);
    }
}

async fn connect(urls: &[String]) -> Result<Vec<Channel>, Error> {
    let mut channels = Vec::with_capacity(urls.len());
    for url in urls {
        let endpoint = Endpoint::from_shared(url.clone())?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true);
        channels.push(endpoint.connect().await?);
    }
    Ok(channels)
}

fn report(o: &Options, t: &Tally, secs: f64) -> serde_json::Value {
    let top: Vec<[u64; 4]> = t
        .top
        .iter()
        .map(|(&(rank, hour), &(offered, admitted))| [rank, hour, offered, admitted])
        .collect();
    serde_json::json!({
        "command": if o.zipf_load { "zipf" } else { "touch" },
        "users": o.users, "per_request": o.per_request, "calls": t.calls,
        "decisions": t.decisions, "admitted": t.admitted, "over": t.over, "failed": t.failed,
        "first_failure": t.first_failure, "secs": secs, "per_target": t.per_target, "top": top,
    })
}

// One thread: the client's share of this machine's two cores stays under one.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let o = Options::parse(&args)?;
    let channels = connect(&o.urls).await?;
    let zipf = o.zipf_load.then(|| Zipf::new(o.users, o.zipf));
    let run = Arc::new(Run {
        channels,
        next: AtomicU64::new(0),
        zipf,
        start: Instant::now(),
        o,
    });
    let workers: Vec<_> = (0..run.o.concurrency as u64)
        .map(|i| tokio::spawn(run.clone().worker(i)))
        .collect();
    let mut total = Tally::default();
    for w in workers {
        total.merge(w.await?);
    }
    let secs = run.start.elapsed().as_secs_f64();
    println!("{}", report(&run.o, &total, secs));
    if total.failed > 0 {
        return Err(format!("{} calls failed", total.failed).into());
    }
    Ok(())
}
