//! The Rate Limit Quota Service's scale envelope: N simulated Envoys against a real `sluice`
//! process, each on its own `StreamRateLimitQuotas` stream over real sockets, each reporting two
//! buckets every second (`tenant: shared`, held by all N, and `tenant: e<i>`, its own; the
//! stream's first report names the domain, and every report does, as Envoy's do). Measured on
//! the sluice process over the steady period (after every stream's first answer and two more
//! reports): resident memory per stream (VmRSS with the streams open, less VmRSS before the
//! first), CPU time per report (utime + stime over the reports sent in the period) and the
//! assignment latency (a report sent to the answer carrying its two assignments; p50, p99).
//!
//! Streams share HTTP/2 connections, STREAMS_PER_CONNECTION (100, Sluice's default
//! SLUICE_MAX_CONCURRENT_STREAMS, which is raised to match when more are asked) on each; the
//! client runs on one tokio worker thread. Envoy `i` reports at `i / N` of the interval, so
//! reports arrive spread evenly, as from Envoys that were not started together. Prints
//! human-readable lines on stderr and one JSON line on stdout (with `connections`, the idle
//! process's `cpu_idle_us_per_s`, and `pushes`: split changes Sluice pushed in the steady
//! period); panics naming the stream when one fails, and exits 1 after the JSON when a report
//! is not answered within 5 s (`missing_answers`). CPU time comes in clock ticks (10 ms): over
//! 10 s, ± 1,000 us per report at N = 1, ± 1 at N = 1000.
//!
//! ```sh
//! cargo build --release -p sluice-bench --bin scale_rlqs --bin sluice
//! cargo run --release -p sluice-bench --bin scale_rlqs -- target/release/sluice 1000 10 [STREAMS_PER_CONNECTION]
//! ```

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::Strategy;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Kind;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

const DOMAIN: &str = "scale";
/// Every tenant its own limit (a key-only rule): the shared bucket is split among all N
/// Envoys, each Envoy's own bucket is whole to it.
const CONFIG: &str = "domain: scale\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n";
const SHARED: &str = "shared";
const INTERVAL: Duration = Duration::from_secs(1);
/// Reports before the steady period: Sluice has measured each stream's interval, and the
/// shared bucket's split has settled, after the first two.
const WARMUP_REPORTS: u32 = 2;
/// A report answered later than this, or not at all, counts as missing (and fails the run).
const ANSWER_BOUND: Duration = Duration::from_secs(5);
/// Every stream opened and its first report answered within this.
const OPEN_BOUND: Duration = Duration::from_secs(60);
/// How long the idle process's CPU time is measured, before any stream.
const IDLE: Duration = Duration::from_secs(2);
/// Requests each Envoy reports as attempted per report (the demand Sluice splits by).
const ATTEMPTED: u64 = 10;

struct Args {
    bin: PathBuf,
    n: usize,
    seconds: u32,
    per_connection: usize,
}

impl Args {
    fn parse() -> Args {
        let usage = "usage: scale_rlqs SLUICE_BIN N [SECONDS] [STREAMS_PER_CONNECTION]";
        let mut args = std::env::args().skip(1);
        let bin = PathBuf::from(args.next().expect(usage));
        let mut number = |default: Option<usize>| {
            args.next()
                .map(|a| a.parse::<usize>().ok().filter(|&v| v > 0).expect(usage))
                .or(default)
                .expect(usage)
        };
        let n = number(None);
        let seconds = u32::try_from(number(Some(10))).expect(usage);
        let per_connection = number(Some(100));
        Args {
            bin,
            n,
            seconds,
            per_connection,
        }
    }

    fn connections(&self) -> usize {
        self.n.div_ceil(self.per_connection)
    }
}

/// The `sluice` process on free loopback ports, killed when dropped (its log printed when
/// dropped by a panic).
struct Sluice {
    child: Child,
    http: u16,
    grpc: u16,
    dir: tempfile::TempDir,
}

impl Sluice {
    fn start(args: &Args) -> Sluice {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let config = dir.path().join("scale.yaml");
        std::fs::write(&config, CONFIG).expect("write the config");
        let log = std::fs::File::create(dir.path().join("sluice.log")).expect("create the log");
        let [http, grpc, debug] = free_ports();
        let mut cmd = Command::new(&args.bin);
        for v in [
            "REDIS_URL",
            "BACKEND_TYPE",
            "RUNTIME_ROOT",
            "SLUICE_CONFIG",
            "PEERS",
        ] {
            cmd.env_remove(v);
        }
        cmd.arg("--config")
            .arg(&config)
            .env("HOST", "127.0.0.1")
            .env("GRPC_HOST", "127.0.0.1")
            .env("DEBUG_HOST", "127.0.0.1")
            .env("PORT", http.to_string())
            .env("GRPC_PORT", grpc.to_string())
            .env("DEBUG_PORT", debug.to_string())
            .env("LOG_LEVEL", "warn")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log"))
            .stderr(log);
        if args.per_connection > 100 {
            // The listener's streams per connection, else the streams past 100 would wait.
            cmd.env(
                "SLUICE_MAX_CONCURRENT_STREAMS",
                args.per_connection.to_string(),
            );
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", args.bin.display()));
        let mut sluice = Sluice {
            child,
            http,
            grpc,
            dir,
        };
        sluice.wait_ready();
        sluice
    }

    fn wait_ready(&mut self) {
        for _ in 0..400 {
            if let Some(status) = self.child.try_wait().expect("the child's status") {
                panic!("sluice exited with {status} before it was ready");
            }
            if healthy(self.http) && TcpStream::connect(("127.0.0.1", self.grpc)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("sluice was not ready within 20 s");
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Sluice {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.path().join("sluice.log"));
            let log = log.unwrap_or_default();
            eprintln!(
                "--- sluice log ---\n{}",
                &log[log.len().saturating_sub(4000)..]
            );
        }
    }
}

/// Three distinct ports that were free on 127.0.0.1 a moment ago.
fn free_ports() -> [u16; 3] {
    let listeners: Vec<TcpListener> = (0..3)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a free port"))
        .collect();
    let port = |i: usize| listeners[i].local_addr().expect("its address").port();
    [port(0), port(1), port(2)]
}

/// Whether `GET /healthcheck` on `port` answers 200.
fn healthy(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let request = "GET /healthcheck HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let mut answer = String::new();
    s.write_all(request.as_bytes()).is_ok()
        && s.read_to_string(&mut answer).is_ok()
        && answer.starts_with("HTTP/1.1 200")
}

/// VmRSS of process `pid`, in bytes.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .expect("VmRSS in /proc/PID/status")
}

/// utime + stime of process `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("its stat");
    // Fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat[stat.rfind(')').expect("(comm)") + 1..]
        .split_whitespace()
        .collect();
    let field = |n: usize| fields[n - 3].parse::<u64>().expect("a tick count");
    field(14) + field(15)
}

/// Clock ticks per second (USER_HZ), from `getconf CLK_TCK`; 100 when that fails.
fn ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .unwrap_or(100.0)
}

/// When every Envoy reports: its first report of the timeline at `start` plus its offset,
/// then every interval; the steady period is `[steady_from, steady_until)`.
#[derive(Clone, Copy)]
struct Timeline {
    start: Instant,
    steady_from: Instant,
    steady_until: Instant,
}

impl Timeline {
    fn steady(&self, at: Instant) -> bool {
        (self.steady_from..self.steady_until).contains(&at)
    }
}

/// What one Envoy saw in the steady period.
#[derive(Default)]
struct Outcome {
    reports: u64,
    latencies: Vec<Duration>,
    missing: u64,
    pushes: u64,
}

fn bucket(tenant: &str) -> BucketId {
    BucketId {
        bucket: [("tenant".to_owned(), tenant.to_owned())].into(),
    }
}

/// One simulated Envoy's stream: reports go out through `tx`, answers come from `rx`; `sent`
/// holds the reports not yet answered, oldest first: when each was sent, and whether it was
/// due in the steady period.
struct EnvoyStream {
    tenant: String,
    tx: mpsc::Sender<RateLimitQuotaUsageReports>,
    rx: tonic::Streaming<RateLimitQuotaResponse>,
    sent: VecDeque<(Instant, bool)>,
}

impl EnvoyStream {
    async fn open(channel: Channel, i: usize) -> Result<EnvoyStream, String> {
        let (tx, reports) = mpsc::channel(4);
        let rx = RateLimitQuotaServiceClient::new(channel)
            .stream_rate_limit_quotas(ReceiverStream::new(reports))
            .await
            .map_err(|s| format!("stream {i} did not open: {s}"))?
            .into_inner();
        Ok(EnvoyStream {
            tenant: format!("e{i}"),
            tx,
            rx,
            sent: VecDeque::new(),
        })
    }

    async fn report(&mut self, steady: bool) -> Result<(), String> {
        let usage = |tenant: &str| BucketQuotaUsage {
            bucket_id: Some(bucket(tenant)),
            time_elapsed: None,
            num_requests_allowed: ATTEMPTED,
            num_requests_denied: 0,
        };
        let report = RateLimitQuotaUsageReports {
            domain: DOMAIN.to_owned(),
            bucket_quota_usages: vec![usage(SHARED), usage(&self.tenant)],
        };
        self.sent.push_back((Instant::now(), steady));
        self.tx
            .send(report)
            .await
            .map_err(|_| format!("{}: the stream closed", self.tenant))
    }

    /// The next message from Sluice.
    async fn message(&mut self) -> Result<RateLimitQuotaResponse, String> {
        match self.rx.message().await {
            Ok(Some(m)) => Ok(m),
            Ok(None) => Err(format!("{}: the stream ended", self.tenant)),
            Err(s) => Err(format!("{}: the stream failed: {s}", self.tenant)),
        }
    }

    /// The report `answer` answers, or `None` for a push (an answer names every bucket
    /// reported, a push only the shared one whose split moved).
    fn answered(
        &mut self,
        answer: &RateLimitQuotaResponse,
    ) -> Result<Option<(Instant, bool)>, String> {
        let own = |a: &BucketAction| {
            a.bucket_id
                .as_ref()
                .and_then(|b| b.bucket.get("tenant"))
                .is_some_and(|t| *t == self.tenant)
        };
        if !answer.bucket_action.iter().any(own) {
            return Ok(None);
        }
        let token_bucket = |a: &BucketAction| match &a.bucket_action {
            Some(Kind::QuotaAssignmentAction(q)) => matches!(
                q.rate_limit_strategy
                    .as_ref()
                    .and_then(|s| s.strategy.as_ref()),
                Some(Strategy::TokenBucket(_))
            ),
            _ => false,
        };
        let actions = &answer.bucket_action;
        if actions.len() != 2 || !actions.iter().all(token_bucket) {
            return Err(format!(
                "{}: not two token buckets: {answer:?}",
                self.tenant
            ));
        }
        let sent = self.sent.pop_front();
        sent.map(Some)
            .ok_or_else(|| format!("{}: an answer to no report", self.tenant))
    }

    /// Reports every interval from `t.start + offset` until the steady period ends, recording
    /// the steady reports and their answers, then waits for the last answers (at most
    /// [`ANSWER_BOUND`]). Returns itself too, so that the stream stays open until dropped.
    async fn run(mut self, t: Timeline, offset: Duration) -> Result<(Outcome, Self), String> {
        let mut outcome = Outcome::default();
        let mut due = t.start + offset;
        let mut drain_until = None;
        loop {
            if due >= t.steady_until {
                if self.sent.is_empty() {
                    break;
                }
                drain_until.get_or_insert(Instant::now() + ANSWER_BOUND);
            }
            let wake = drain_until.unwrap_or(due);
            tokio::select! {
                () = tokio::time::sleep_until(wake) => {
                    if drain_until.is_some() {
                        break;
                    }
                    let steady = t.steady(due);
                    outcome.reports += u64::from(steady);
                    self.report(steady).await?;
                    due += INTERVAL;
                }
                message = self.message() => {
                    let message = message?;
                    let Some((sent, steady)) = self.answered(&message)? else {
                        outcome.pushes += u64::from(t.steady(Instant::now()));
                        continue;
                    };
                    let latency = sent.elapsed();
                    if latency > ANSWER_BOUND {
                        outcome.missing += 1;
                    } else if steady {
                        outcome.latencies.push(latency);
                    }
                }
            }
        }
        outcome.missing += self.sent.len() as u64;
        Ok((outcome, self))
    }
}

/// One Envoy: opens its stream, reports once and waits for the answer (then says so on
/// `ready`), then reports on the timeline.
async fn envoy(
    i: usize,
    n: usize,
    channel: Channel,
    ready: mpsc::Sender<Result<(), String>>,
    mut timeline: watch::Receiver<Option<Timeline>>,
) -> Result<(Outcome, EnvoyStream), String> {
    let first = async {
        let mut stream = EnvoyStream::open(channel, i).await?;
        stream.report(false).await?;
        loop {
            let message = stream.message().await?;
            if stream.answered(&message)?.is_some() {
                break;
            }
        }
        Ok(stream)
    };
    let opened = first.await;
    let _ = ready
        .send(opened.as_ref().map(|_| ()).map_err(Clone::clone))
        .await;
    let stream = opened?;
    let t = timeline
        .wait_for(Option::is_some)
        .await
        .map_err(|_| "no timeline".to_owned())?
        .expect("waited for it");
    let offset = INTERVAL.mul_f64(i as f64 / n as f64);
    stream.run(t, offset).await
}

/// The steady period, as the client and the sluice process saw it.
struct Run {
    outcomes: Vec<Outcome>,
    cpu_ticks: u64,
    rss: u64,
    open_secs: f64,
}

/// `args.connections()` HTTP/2 connections to Sluice's gRPC port.
async fn connect(args: &Args, grpc: u16) -> Vec<Channel> {
    let endpoint = Endpoint::from_shared(format!("http://127.0.0.1:{grpc}")).expect("a URI");
    let mut channels = Vec::with_capacity(args.connections());
    for _ in 0..args.connections() {
        channels.push(endpoint.connect().await.expect("connect to the gRPC port"));
    }
    channels
}

/// Opens the N streams, runs the timeline, and measures the sluice process over its steady
/// period; the streams stay open until it is measured.
async fn drive(args: &Args, sluice: &Sluice) -> Run {
    let channels = connect(args, sluice.grpc).await;
    let (ready_tx, mut ready) = mpsc::channel(args.n);
    let (timeline_tx, timeline) = watch::channel(None);
    let opening = Instant::now();
    let tasks: Vec<_> = (0..args.n)
        .map(|i| {
            let channel = channels[i / args.per_connection].clone();
            let envoy = envoy(i, args.n, channel, ready_tx.clone(), timeline.clone());
            tokio::spawn(envoy)
        })
        .collect();
    for _ in 0..args.n {
        match tokio::time::timeout(OPEN_BOUND, ready.recv()).await {
            Ok(Some(Ok(()))) => {}
            Ok(Some(Err(e))) => panic!("a stream failed to open: {e}"),
            Ok(None) | Err(_) => panic!("streams not all answered within {OPEN_BOUND:?}"),
        }
    }
    let open_secs = opening.elapsed().as_secs_f64();
    let start = Instant::now() + Duration::from_millis(100);
    let steady_from = start + INTERVAL * WARMUP_REPORTS;
    let t = Timeline {
        start,
        steady_from,
        steady_until: steady_from + Duration::from_secs(u64::from(args.seconds)),
    };
    timeline_tx.send(Some(t)).expect("the Envoys wait for it");
    tokio::time::sleep_until(t.steady_from).await;
    let cpu_from = cpu_ticks(sluice.pid());
    tokio::time::sleep_until(t.steady_until).await;
    let cpu_ticks = cpu_ticks(sluice.pid()) - cpu_from;
    let rss = rss_bytes(sluice.pid());
    let mut outcomes = Vec::with_capacity(args.n);
    let mut streams = Vec::with_capacity(args.n);
    for task in tasks {
        let (outcome, stream) = task
            .await
            .expect("an Envoy task panicked")
            .unwrap_or_else(|e| panic!("a stream failed: {e}"));
        outcomes.push(outcome);
        streams.push(stream);
    }
    drop(streams);
    Run {
        outcomes,
        cpu_ticks,
        rss,
        open_secs,
    }
}

/// The `q` quantile of sorted `latencies` in milliseconds (nearest rank), as JSON: `null`
/// when there is none.
fn quantile_ms(latencies: &[Duration], q: f64) -> String {
    if latencies.is_empty() {
        return "null".to_owned();
    }
    let rank = ((q * latencies.len() as f64).ceil() as usize).clamp(1, latencies.len());
    format!("{:.3}", latencies[rank - 1].as_secs_f64() * 1e3)
}

fn main() {
    let args = Args::parse();
    let sluice = Sluice::start(&args);
    // Idle: the baseline, and what Sluice spends with no stream (its sweeps, the config poll).
    std::thread::sleep(Duration::from_millis(500));
    let rss_base = rss_bytes(sluice.pid());
    let idle_from = cpu_ticks(sluice.pid());
    std::thread::sleep(IDLE);
    let idle_ticks = cpu_ticks(sluice.pid()) - idle_from;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let run = runtime.block_on(drive(&args, &sluice));
    drop(sluice);
    report(&args, &run, rss_base, idle_ticks);
}

/// Prints the run on stderr and as one JSON line on stdout; exits 1 on a missing answer.
fn report(args: &Args, run: &Run, rss_base: u64, idle_ticks: u64) {
    let (n, seconds) = (args.n, args.seconds);
    let mut latencies: Vec<Duration> = run
        .outcomes
        .iter()
        .flat_map(|o| o.latencies.iter().copied())
        .collect();
    latencies.sort_unstable();
    let sum = |f: fn(&Outcome) -> u64| run.outcomes.iter().map(f).sum::<u64>();
    let (reports, missing, pushes) = (sum(|o| o.reports), sum(|o| o.missing), sum(|o| o.pushes));
    let tick_us = 1e6 / ticks_per_second();
    let cpu_us_per_report = run.cpu_ticks as f64 * tick_us / reports.max(1) as f64;
    let cpu_idle_us_per_s = idle_ticks as f64 * tick_us / IDLE.as_secs_f64();
    let bytes_per_stream = run.rss.saturating_sub(rss_base) as f64 / n as f64;
    let (p50, p99) = (quantile_ms(&latencies, 0.5), quantile_ms(&latencies, 0.99));
    let connections = args.connections();
    eprintln!(
        "scale_rlqs: {n} streams on {connections} connections, open and answered in {:.2} s\n\
         steady {seconds} s: {reports} reports, {pushes} pushes, {missing} missing answers\n\
         rss {:.1} MiB idle, {:.1} MiB with the streams: {bytes_per_stream:.0} bytes per stream\n\
         cpu {:.0} ms: {cpu_us_per_report:.1} us per report (± {:.1}; idle: {cpu_idle_us_per_s:.0} us/s)\n\
         assignment latency p50 {p50} ms, p99 {p99} ms",
        run.open_secs,
        rss_base as f64 / 1048576.0,
        run.rss as f64 / 1048576.0,
        run.cpu_ticks as f64 * tick_us / 1e3,
        tick_us / reports.max(1) as f64,
    );
    println!(
        "{{\"curve\":\"rlqs\",\"n\":{n},\"seconds\":{seconds},\"report_interval_ms\":{},\
         \"connections\":{connections},\"reports\":{reports},\"rss_base_bytes\":{rss_base},\
         \"rss_bytes\":{},\"bytes_per_stream\":{bytes_per_stream:.0},\
         \"cpu_us_per_report\":{cpu_us_per_report:.1},\"cpu_idle_us_per_s\":{cpu_idle_us_per_s:.0},\
         \"assign_p50_ms\":{p50},\"assign_p99_ms\":{p99},\"pushes\":{pushes},\
         \"missing_answers\":{missing}}}",
        INTERVAL.as_millis(),
        run.rss,
    );
    if missing > 0 || latencies.is_empty() {
        eprintln!("scale_rlqs: {missing} reports not answered within {ANSWER_BOUND:?}");
        std::process::exit(1);
    }
}
