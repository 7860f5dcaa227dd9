//! `PUT`s per second on one node's runtime limits API (issue 38: at least 1,000 a second).
//!
//! C connections to the debug port, HTTP/1.1 kept alive, each sending its next
//! `PUT /limits/d/tenant=t<i>` as soon as the last is answered (closed loop), with
//! `Authorization: Bearer TOKEN` and a body of `{"unit":"minute","requests_per_unit":<n>}`
//! (n changes from one call to the next, so a replaced limit really changes). Prints the calls
//! answered 200 or 201, any other answer by status, calls per second and latency percentiles.
//! A call not answered within [`CALL_TIMEOUT`] is counted as such and ends its connection.
//!
//! - `replace ADDR TOKEN C SECONDS TENANTS`: for SECONDS, each call to one of `t0` ..
//!   `t<TENANTS-1>` picked at random: replaces once they exist.
//! - `create ADDR TOKEN C N [FIRST]`: `t<FIRST>` .. `t<FIRST+N-1>`, each once (new paths), the
//!   connections taking the next in turn; then stops.
//!
//! ```sh
//! cargo run --release -p sluice-bench --bin runtime_puts -- create 127.0.0.1:6070 s3cr3t 32 100000
//! cargo run --release -p sluice-bench --bin runtime_puts -- replace 127.0.0.1:6070 s3cr3t 32 10 100000
//! ```

#![allow(
    clippy::disallowed_methods,
    reason = "a benchmark's or load generator's own stopwatch, outside Sluice"
)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper_util::rt::TokioIo;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// How long a call may wait for its answer: well past SAVE_WAIT (10 s), after which Sluice
/// answers 503 itself.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

const USAGE: &str = "usage: runtime_puts replace ADDR TOKEN C SECONDS TENANTS\n       \
                     runtime_puts create ADDR TOKEN C N [FIRST]";

/// Which tenant a call sets.
enum Plan {
    /// A random one of `0..tenants` until `until`.
    Replace { tenants: u64, until: Instant },
    /// The next of `first..end`, each once.
    Create { next: Arc<AtomicU64>, end: u64 },
}

/// What one connection saw: latencies of the calls answered 2xx, and the count of each other
/// status.
#[derive(Default)]
struct Seen {
    ok_us: Vec<u32>,
    other: BTreeMap<u16, u64>,
    /// Calls not answered within [`CALL_TIMEOUT`].
    timeouts: u64,
}

/// A small xorshift generator: which tenant a `replace` call picks.
fn next_random(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

async fn connection(
    addr: String,
    token: String,
    plan: Arc<Plan>,
    seed: u64,
) -> Result<Seen, Error> {
    let tcp = tokio::net::TcpStream::connect(&addr).await?;
    tcp.set_nodelay(true)?;
    let (mut sender, conn) = http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let bearer = format!("Bearer {token}");
    let mut seen = Seen::default();
    let mut x = seed | 1;
    loop {
        let tenant = match &*plan {
            Plan::Replace { tenants, until } => {
                if Instant::now() >= *until {
                    break;
                }
                next_random(&mut x) % tenants
            }
            Plan::Create { next, end } => {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= *end {
                    break;
                }
                i
            }
        };
        let per_unit = 1 + next_random(&mut x) % 1000;
        let request = hyper::Request::put(format!("/limits/d/tenant=t{tenant}"))
            .header(HOST, &addr)
            .header(AUTHORIZATION, &bearer)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(format!(
                r#"{{"unit":"minute","requests_per_unit":{per_unit}}}"#
            ))))?;
        let t = Instant::now();
        let call = async {
            sender.ready().await?;
            let answer = sender.send_request(request).await?;
            let status = answer.status().as_u16();
            answer.into_body().collect().await?;
            Ok::<_, Error>(status)
        };
        let Ok(status) = tokio::time::timeout(CALL_TIMEOUT, call).await else {
            seen.timeouts += 1;
            break;
        };
        let status = status?;
        let took = u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX);
        if matches!(status, 200 | 201) {
            seen.ok_us.push(took);
        } else {
            *seen.other.entry(status).or_default() += 1;
        }
    }
    Ok(seen)
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted[at]) / 1000.0
}

async fn run(addr: String, token: String, connections: usize, plan: Plan) -> Result<(), Error> {
    let plan = Arc::new(plan);
    let start = Instant::now();
    let tasks: Vec<_> = (0..connections)
        .map(|c| {
            let seed = 0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(c as u64 + 1);
            tokio::spawn(connection(
                addr.clone(),
                token.clone(),
                Arc::clone(&plan),
                seed,
            ))
        })
        .collect();
    let mut all = Seen::default();
    for task in tasks {
        let seen = task.await??;
        all.ok_us.extend(seen.ok_us);
        for (status, n) in seen.other {
            *all.other.entry(status).or_default() += n;
        }
        all.timeouts += seen.timeouts;
    }
    let took = start.elapsed().as_secs_f64();
    all.ok_us.sort_unstable();
    let ok = all.ok_us.len();
    println!(
        "runtime_puts: {connections} connections, {took:.2} s: {ok} answered 200/201 ({:.0} a second), other answers {:?}, not answered within {CALL_TIMEOUT:?} {}\n\
         latency ms: p50 {:.2}, p90 {:.2}, p99 {:.2}, max {:.2}",
        ok as f64 / took,
        all.other,
        all.timeouts,
        percentile(&all.ok_us, 0.5),
        percentile(&all.ok_us, 0.9),
        percentile(&all.ok_us, 0.99),
        percentile(&all.ok_us, 1.0),
    );
    Ok(())
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |s: &str| s.parse::<u64>().map_err(|e| format!("{s}: {e}\n{USAGE}"));
    let (addr, token, connections, plan) =
        match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["replace", addr, token, c, seconds, tenants] => (
                addr,
                token,
                number(c)?,
                Plan::Replace {
                    tenants: number(tenants)?.max(1),
                    until: Instant::now() + Duration::from_secs(number(seconds)?),
                },
            ),
            ["create", addr, token, c, n, ref first @ ..] => {
                let first = first.first().map_or(Ok(0), |f| number(f))?;
                (
                    addr,
                    token,
                    number(c)?,
                    Plan::Create {
                        next: Arc::new(AtomicU64::new(first)),
                        end: first + number(n)?,
                    },
                )
            }
            _ => return Err(USAGE.into()),
        };
    // One thread: the client takes one of the machine's cores at most, the server the rest.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run(
            addr.to_owned(),
            token.to_owned(),
            usize::try_from(connections)?,
            plan,
        ))
}
