//! End-to-end tests of runtime limits (issue 38, docs/runtime-limits.md) against the real
//! `sluice` binary: a limit set on DEBUG_PORT's `/limits/...` decides PORT's next `/json` call,
//! lasts through a `kill -9` in SLUICE_RUNTIME_LIMITS_PATH, and through a YAML reload; tokens
//! rotate by rewriting SLUICE_ADMIN_TOKEN_FILE; a bad token file or limits file stops start-up
//! (exit 64) before a port is bound; `/rlconfig`, `/metrics` and `_history` show the changes;
//! and a sample of the API's errors arrives on the real port. `src/api/limits/tests.rs` covers
//! every status in-process; these prove the wiring. Every process listens on 127.0.0.1 on free
//! ports and is killed when its guard drops; every wait is bounded.

#![allow(
    clippy::disallowed_methods,
    reason = "tests time real processes, sockets and deadlines; Sluice's code reads time through crate::clock"
)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sluice_test_support::process;
use sluice_test_support::process::{free_port, wait_for, with_minute_to_spare};

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// The YAML every test starts from: tenant=acme 100 a minute, tenant=umbrella 1,000 an hour,
/// no other tenant.
const YAML: &str = "domain: edge
descriptors:
  - key: tenant
    value: acme
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: tenant
    value: umbrella
    rate_limit: {unit: hour, requests_per_unit: 1000}
";

/// Two tokens: one named (its changes are `ops`'s in the audit log), one not (named after its
/// line: `token 3`).
const TOKENS: &str = "# the runtime limits API's callers\nops s3cr3t\nbareword-token\n";
const OPS: Option<&str> = Some("s3cr3t");
const UNNAMED: Option<&str> = Some("bareword-token");

const TWO_A_MINUTE: &str = r#"{"unit":"minute","requests_per_unit":2}"#;

/// A test's files: the config directory, the token file, and where runtime limits are saved.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Self {
        let files = Files {
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::create_dir_all(files.config_dir()).unwrap();
        std::fs::create_dir_all(files.state_dir()).unwrap();
        files.write_yaml(YAML);
        std::fs::write(files.tokens(), TOKENS).unwrap();
        files
    }

    fn config_dir(&self) -> PathBuf {
        self.dir.path().join("config")
    }

    fn tokens(&self) -> PathBuf {
        self.dir.path().join("tokens")
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn limits_file(&self) -> PathBuf {
        self.state_dir().join("limits.jsonl")
    }

    /// Replaces the YAML at once (a temporary file renamed over it), as a deploy would.
    fn write_yaml(&self, text: &str) {
        replace(&self.config_dir().join("edge.yaml"), text);
    }

    /// `sluice` on these files, with the runtime limits API on and saving; the environment
    /// is the test's alone (nothing of the host's can change what it sees).
    fn sluice(&self) -> Command {
        let mut c = Command::new(BIN);
        c.env_clear()
            .arg("--config")
            .arg(self.config_dir())
            .env("SLUICE_ADMIN_TOKEN_FILE", self.tokens())
            .env("SLUICE_RUNTIME_LIMITS_PATH", self.limits_file())
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        c
    }

    /// A new file for one process's standard error.
    fn log(&self) -> PathBuf {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        self.dir.path().join(format!("sluice-{n}.log"))
    }
}

/// Writes `path` whole in one rename, so no reader sees it half-written.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A running sluice, killed (SIGKILL) when dropped.
struct Sluice {
    child: Child,
    http: u16,
    debug: u16,
    log: PathBuf,
}

impl Drop for Sluice {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Sluice {
    /// Starts `c` on free ports and waits (20 s at most) until PORT and DEBUG_PORT answer;
    /// panics with its standard error if it exits first.
    fn start(files: &Files, mut c: Command) -> Sluice {
        let (http, grpc, debug) = (free_port(), free_port(), free_port());
        let log = files.log();
        c.env("HOST", "127.0.0.1")
            .env("GRPC_HOST", "127.0.0.1")
            .env("DEBUG_HOST", "127.0.0.1")
            .env("PORT", http.to_string())
            .env("GRPC_PORT", grpc.to_string())
            .env("DEBUG_PORT", debug.to_string())
            .stderr(std::fs::File::create(&log).unwrap());
        let child = c.spawn().expect("spawn sluice");
        let mut s = Sluice {
            child,
            http,
            debug,
            log,
        };
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = s.child.try_wait() {
                panic!("sluice exited with {status} at start:\n{}", s.stderr());
            }
            let up = |port, path| {
                sluice_test_support::http::http(port, "GET", path, "")
                    .is_some_and(|(status, _)| status == 200)
            };
            if up(s.http, "/healthcheck") && up(s.debug, "/rlconfig") {
                return s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "sluice did not answer within 20 s:\n{}",
                s.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL, as `kill -9`: no drain, no shutdown hook, nothing flushed on the way out.
    fn kill_9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// A call on the runtime limits API (DEBUG_PORT), with `token` as a bearer token.
    fn api(&self, method: &str, path: &str, token: Option<&str>, body: &str) -> Reply {
        let auth = token.map(|t| format!("Bearer {t}"));
        call(self.debug, method, path, auth.as_deref(), body.as_bytes())
    }

    /// A decision on PORT's `/json` for `edge` and one descriptor of `entries`: the HTTP status
    /// and the descriptor's status (its code and current limit).
    fn decide(&self, entries: &[(&str, &str)]) -> (u16, Value) {
        let entries: Vec<Value> = entries
            .iter()
            .map(|(k, v)| json!({"key": k, "value": v}))
            .collect();
        let body = json!({"domain": "edge", "descriptors": [{"entries": entries}]});
        let r = call(
            self.http,
            "POST",
            "/json",
            None,
            body.to_string().as_bytes(),
        );
        let v = r.json();
        (r.status, v["statuses"][0].clone())
    }

    /// What `/debug/explain` says of `edge` and `descriptor` (`k=v&k2=v2`; nothing counted): the
    /// matched limit.
    fn explained(&self, descriptor: &str) -> Value {
        let path = format!("/debug/explain?domain=edge&descriptor={descriptor}");
        let r = call(self.debug, "GET", &path, None, b"");
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["descriptors"][0]["limit"].clone()
    }

    fn text(&self, path: &str) -> String {
        let r = call(self.debug, "GET", path, None, b"");
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        r.body
    }
}

/// A descriptor status's current limit (`None`: no limit matched).
fn requests_per_unit(status: &Value) -> Option<u64> {
    status["currentLimit"]["requestsPerUnit"].as_u64()
}

/// Runs `c` (which must stop by itself) on ports already taken: its exit code and standard
/// error. A command that got as far as binding would fail on the taken ports with exit 1, so
/// exit 64 shows it stopped before binding any.
fn refused_before_binding(files: &Files, mut c: Command) -> (Option<i32>, String) {
    // Port 0: the kernel picks a port nobody holds. (A port from `free_port` was bound again
    // here, and another test could take it in between: EADDRINUSE, seen once in CI.)
    let taken: Vec<TcpListener> = (0..3)
        .map(|_| TcpListener::bind(("127.0.0.1", 0)).unwrap())
        .collect();
    let port = |i: usize| taken[i].local_addr().unwrap().port().to_string();
    let log = files.log();
    c.env("HOST", "127.0.0.1")
        .env("GRPC_HOST", "127.0.0.1")
        .env("DEBUG_HOST", "127.0.0.1")
        .env("PORT", port(0))
        .env("GRPC_PORT", port(1))
        .env("DEBUG_PORT", port(2))
        .stderr(std::fs::File::create(&log).unwrap());
    let mut child = c.spawn().expect("spawn sluice");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "sluice did not stop within 20 s:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(taken);
    (
        status.code(),
        std::fs::read_to_string(&log).unwrap_or_default(),
    )
}

/// One HTTP/1.1 answer.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("{e}: not JSON ({}): {}", self.status, self.body))
    }

    /// The `error` of a JSON error answer, checking that it is one.
    fn error(&self) -> String {
        assert_eq!(
            self.header("content-type"),
            Some("application/json"),
            "{self:?}"
        );
        let v = self.json();
        v["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no error in {}", self.body))
            .to_owned()
    }
}

/// One request with `Connection: close` to 127.0.0.1:`port`, `authorization` as that header;
/// panics if nothing answers within 15 s (a change's answer waits for its save, 10 s at most).
/// The body is written as far as the server reads it: one refused for its size (413) may be
/// answered before the rest is sent.
fn call(port: u16, method: &str, path: &str, authorization: Option<&str>, body: &[u8]) -> Reply {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let auth = authorization.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}Content-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    if let Err(e) = s.read_to_end(&mut raw) {
        assert!(
            !raw.is_empty(),
            "{method} {path}: no answer from port {port}: {e}"
        );
    }
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("{method} {path}: not an HTTP answer: {raw:?}"));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{method} {path}: no status in {head:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    assert!(
        !headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("transfer-encoding")),
        "{method} {path}: a chunked answer, which this client does not read: {head}"
    );
    Reply {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// A sample's value in a Prometheus exposition: `name` with its labels as written
/// (`sluice_runtime_limit_changes_total{op="put"}`).
fn metric(exposition: &str, name: &str) -> Option<f64> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// A limit PUT on the debug port decides PORT's next call: the YAML's 100 a minute for
/// tenant=acme becomes 2 (the third call is over); DELETE brings the YAML's back.
#[test]
fn a_limit_set_at_run_time_decides_the_next_call_and_its_delete_restores_the_yamls() {
    // The counts below must stay in one MINUTE window.
    with_minute_to_spare(20);
    let files = Files::new();
    let s = Sluice::start(&files, files.sluice());
    let r = s.api("PUT", "/limits/edge/tenant=acme", OPS, TWO_A_MINUTE);
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(
        r.json(),
        json!({"unit": "minute", "requests_per_unit": 2}),
        "the answer is the limit as set"
    );
    for n in 1..=2 {
        let (status, st) = s.decide(&[("tenant", "acme")]);
        assert_eq!(
            (status, st["code"].as_str()),
            (200, Some("OK")),
            "call {n}: {st}"
        );
        assert_eq!(requests_per_unit(&st), Some(2), "{st}");
    }
    let (status, st) = s.decide(&[("tenant", "acme")]);
    assert_eq!(
        (status, st["code"].as_str()),
        (429, Some("OVER_LIMIT")),
        "the third call in the minute: {st}"
    );

    let r = s.api("DELETE", "/limits/edge/tenant=acme", OPS, "");
    assert_eq!((r.status, r.body.as_str()), (204, ""));
    let (status, st) = s.decide(&[("tenant", "acme")]);
    assert_eq!((status, st["code"].as_str()), (200, Some("OK")), "{st}");
    assert_eq!(requests_per_unit(&st), Some(100), "the YAML's again: {st}");
    assert_eq!(
        s.api("GET", "/limits/edge/tenant=acme", OPS, "").status,
        404
    );
}

/// A runtime limit at a path the YAML lacks is added, as if written into it: a value it has no
/// node for, a level below one it has (a percent-encoded value, decoded as the descriptor's),
/// a domain it has not; the YAML's own nodes stay as they were.
#[test]
fn a_runtime_limit_adds_the_paths_and_domains_the_yaml_lacks() {
    // The counts below must stay in one HOUR window (and so in one day).
    process::with_window_to_spare(3600, 10);
    let files = Files::new();
    let s = Sluice::start(&files, files.sluice());
    let (status, hooli) = s.decide(&[("tenant", "hooli")]);
    assert_eq!(
        (status, requests_per_unit(&hooli)),
        (200, None),
        "no limit for hooli in the YAML: {hooli}"
    );
    let r = s.api(
        "PUT",
        "/limits/edge/tenant=hooli",
        OPS,
        r#"{"unit":"hour","requests_per_unit":1}"#,
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let r = s.api(
        "PUT",
        "/limits/edge/tenant=acme/path=%2Fcheckout",
        OPS,
        r#"{"unit":"hour","requests_per_unit":1}"#,
    );
    assert_eq!(r.status, 201, "{}", r.body);
    for entries in [
        &[("tenant", "hooli")][..],
        &[("tenant", "acme"), ("path", "/checkout")][..],
    ] {
        let (status, st) = s.decide(entries);
        assert_eq!((status, requests_per_unit(&st)), (200, Some(1)), "{st}");
        let (status, st) = s.decide(entries);
        assert_eq!((status, st["code"].as_str()), (429, Some("OVER_LIMIT")));
    }
    // A domain the YAML has not.
    let r = s.api(
        "PUT",
        "/limits/intranet/user=bob",
        OPS,
        r#"{"unit":"day","requests_per_unit":1}"#,
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let body =
        r#"{"domain":"intranet","descriptors":[{"entries":[{"key":"user","value":"bob"}]}]}"#;
    let statuses: Vec<u16> = (0..2)
        .map(|_| call(s.http, "POST", "/json", None, body.as_bytes()).status)
        .collect();
    assert_eq!(statuses, [200, 429]);
    // The YAML's own nodes are as they were: tenant=acme alone is the YAML's 100.
    let (_, st) = s.decide(&[("tenant", "acme")]);
    assert_eq!(requests_per_unit(&st), Some(100), "{st}");

    listed_by_pages(&s);
}

/// `GET /limits/edge`, whole and a page at a time, holding the two paths the test above set.
fn listed_by_pages(s: &Sluice) {
    let r = s.api("GET", "/limits/edge", OPS, "");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json(),
        json!({
            "domain": "edge",
            "limits": [
                {"path": "tenant=acme/path=%2Fcheckout", "limit": {"unit": "hour", "requests_per_unit": 1}},
                {"path": "tenant=hooli", "limit": {"unit": "hour", "requests_per_unit": 1}},
            ],
            "next": null,
        })
    );
    let r = s.api("GET", "/limits/edge?limit=1", OPS, "");
    assert_eq!(
        r.json()["next"],
        "tenant=acme/path=%2Fcheckout",
        "{}",
        r.body
    );
    let r = s.api(
        "GET",
        "/limits/edge?limit=1&after=tenant%3Dacme%2Fpath%3D%252Fcheckout",
        OPS,
        "",
    );
    assert_eq!(r.json()["limits"][0]["path"], "tenant=hooli", "{}", r.body);
}

/// SLUICE_RUNTIME_LIMITS_PATH: a change answered is on disk, so a `kill -9` right after the
/// answer loses nothing; a change that could not be saved is answered 503 and saved once the
/// directory is back.
#[test]
fn runtime_limits_survive_a_kill_9() {
    let files = Files::new();
    let s = Sluice::start(&files, files.sluice());
    let body = r#"{"unit":"minute","requests_per_unit":3,"shadow_mode":false}"#;
    let r = s.api("PUT", "/limits/edge/tenant=acme", OPS, body);
    assert_eq!(r.status, 201, "{}", r.body);
    s.kill_9();

    // Appended to the file's journal; the file itself is written when the journal outgrows it.
    assert!(!files.limits_file().exists());
    let journal = files.limits_file().with_file_name("limits.jsonl.journal");
    let saved = std::fs::read_to_string(&journal).expect("the limits file's journal");
    assert_eq!(saved.lines().count(), 1, "{saved}");
    let s = Sluice::start(&files, files.sluice());
    // The journal loaded, the node folds it into the file.
    wait_for(
        "the journal folded into the file",
        Duration::from_secs(10),
        || {
            std::fs::read_to_string(files.limits_file()).is_ok_and(|t| t.contains("acme"))
                && std::fs::read_to_string(&journal).is_ok_and(|t| t.is_empty())
        },
    );
    let r = s.api("GET", "/limits/edge/tenant=acme", OPS, "");
    assert_eq!(r.status, 200, "{}", r.body);
    let v: Value = serde_json::from_str(body).unwrap();
    assert_eq!(r.json(), v, "the body as PUT, back after the restart");
    let (_, st) = s.decide(&[("tenant", "acme")]);
    assert_eq!(requests_per_unit(&st), Some(3), "{st}");
    let metrics = s.text("/metrics");
    assert_eq!(
        metric(&metrics, "sluice_runtime_limits"),
        Some(1.0),
        "loaded"
    );
    let puts = "sluice_runtime_limit_changes_total{op=\"put\"}";
    assert_eq!(metric(&metrics, puts), Some(0.0), "loading is no change");

    // The directory gone: the change applies here, but is answered 503, not saved; it is
    // saved once the directory is back (the writer tries again), and lasts a kill -9 then.
    std::fs::remove_dir_all(files.state_dir()).unwrap();
    let r = s.api("PUT", "/limits/edge/tenant=hooli", OPS, TWO_A_MINUTE);
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(
        r.error()
            .contains("the change applies on this node but is not saved"),
        "{}",
        r.body
    );
    assert_eq!(
        s.api("GET", "/limits/edge/tenant=hooli", OPS, "").status,
        200
    );
    std::fs::create_dir_all(files.state_dir()).unwrap();
    wait_for(
        "the save after the failed one",
        Duration::from_secs(10),
        || std::fs::read_to_string(files.limits_file()).is_ok_and(|t| t.contains("hooli")),
    );
    s.kill_9();
    let s = Sluice::start(&files, files.sluice());
    let r = s.api("GET", "/limits/edge", OPS, "");
    let listed = r.json();
    let paths: Vec<&str> = listed["limits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["tenant=acme", "tenant=hooli"], "{}", r.body);
}

/// A SLUICE_RUNTIME_LIMITS_PATH file that does not parse, or holds a limit the YAML's checks
/// refuse, stops start-up with exit 64 naming the file and line, before any port is bound,
/// and is left as it was.
#[test]
fn a_runtime_limits_file_that_does_not_parse_stops_start_up_naming_file_and_line() {
    let files = Files::new();
    let file = files.limits_file();
    let good = r#"{"domain":"edge","levels":[["tenant","acme"]],"limit":{"unit":"minute","requests_per_unit":2}}"#;
    let bad_unit = r#"{"domain":"edge","levels":[["tenant","x"]],"limit":{"unit":"fortnight","requests_per_unit":2}}"#;
    for (text, expected) in [
        (
            format!("{good}\n\n{bad_unit}\n"),
            format!(
                "SLUICE_RUNTIME_LIMITS_PATH: {}:3: invalid rate limit unit 'fortnight'",
                file.display()
            ),
        ),
        (
            format!("{good}\n{{not json\n"),
            format!("SLUICE_RUNTIME_LIMITS_PATH: {}:2: ", file.display()),
        ),
    ] {
        std::fs::write(&file, &text).unwrap();
        let (code, stderr) = refused_before_binding(&files, files.sluice());
        assert_eq!(code, Some(64), "{stderr}");
        assert!(
            stderr.contains(&expected),
            "expected {expected:?} in:\n{stderr}"
        );
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            text,
            "a file refused is left as it was"
        );
    }
}

/// Tokens rotate without a restart: a new file (renamed over, as a Secret's update) or one
/// rewritten in place takes effect on the next call; the old token is refused 403 at once. A
/// file that no longer parses keeps the tokens in force.
#[test]
fn tokens_rotate_by_rewriting_the_token_file() {
    let files = Files::new();
    let s = Sluice::start(&files, files.sluice());
    let r = s.api("PUT", "/limits/edge/tenant=acme", OPS, TWO_A_MINUTE);
    assert_eq!(r.status, 201, "{}", r.body);

    replace(&files.tokens(), "deployer n3w-t0ken\n");
    let r = s.api("GET", "/limits/edge/tenant=acme", OPS, "");
    assert_eq!(
        r.status, 403,
        "the old token, after the rotation: {}",
        r.body
    );
    assert!(r.error().contains("SLUICE_ADMIN_TOKEN_FILE"), "{}", r.body);
    let new = Some("n3w-t0ken");
    assert_eq!(
        s.api("GET", "/limits/edge/tenant=acme", new, "").status,
        200
    );
    let r = s.api("DELETE", "/limits/edge/tenant=acme", new, "");
    assert_eq!(r.status, 204, "{}", r.body);

    // In place, a different length (so a coarse mtime cannot hide the change).
    std::fs::write(files.tokens(), "deployer a-longer-n3w-t0ken\n").unwrap();
    assert_eq!(s.api("GET", "/limits/edge", new, "").status, 403);
    let newer = Some("a-longer-n3w-t0ken");
    assert_eq!(s.api("GET", "/limits/edge", newer, "").status, 200);

    // A file that no longer parses: the tokens in force stay, and it is logged.
    std::fs::write(files.tokens(), "one two three\n").unwrap();
    assert_eq!(s.api("GET", "/limits/edge", newer, "").status, 200);
    assert_eq!(s.api("GET", "/limits/edge", Some("three"), "").status, 403);
    let logged = s.stderr();
    assert!(
        logged.contains("SLUICE_ADMIN_TOKEN_FILE does not parse"),
        "{logged}"
    );

    // The audit log names who made each change by the token's name.
    let history = s.api("GET", "/limits/_history", newer, "").json();
    let who: Vec<(&str, &str)> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["who"].as_str().unwrap(), r["op"].as_str().unwrap()))
        .collect();
    assert_eq!(who, [("ops", "put"), ("deployer", "delete")], "{history}");
}

/// A token file that cannot be used stops start-up with exit 64 naming the variable, before
/// any port is bound; without the variable the API is off (403 to every call, saying how to
/// turn it on) and decisions are served as ever.
#[test]
fn a_bad_token_file_stops_start_up_and_no_token_file_turns_the_api_off() {
    let files = Files::new();
    let missing = files.dir.path().join("no-such-file");
    let cases = [
        (missing.clone(), None, "No such file"),
        (
            files.tokens(),
            Some("ops s3cr3t extra\n"),
            ":1: expected `[name ]token`, found 3 fields",
        ),
        (
            files.tokens(),
            Some("# nothing but comments\n\n"),
            ": no token (every line is blank or a comment)",
        ),
        (
            files.tokens(),
            Some("a same\nb same\n"),
            ":2: the same token as line 1",
        ),
    ];
    for (path, text, reason) in cases {
        if let Some(text) = text {
            std::fs::write(&path, text).unwrap();
        }
        let mut c = files.sluice();
        c.env("SLUICE_ADMIN_TOKEN_FILE", &path);
        let (code, stderr) = refused_before_binding(&files, c);
        assert_eq!(code, Some(64), "{reason}: {stderr}");
        let expected = format!("SLUICE_ADMIN_TOKEN_FILE={}: ", path.display());
        assert!(
            stderr.contains(&expected) && stderr.contains(reason),
            "expected {expected:?} and {reason:?} in:\n{stderr}"
        );
    }

    std::fs::write(files.tokens(), TOKENS).unwrap();
    let mut c = files.sluice();
    c.env_remove("SLUICE_ADMIN_TOKEN_FILE");
    let s = Sluice::start(&files, c);
    for (method, token) in [("PUT", OPS), ("GET", None)] {
        let r = s.api(method, "/limits/edge/tenant=acme", token, TWO_A_MINUTE);
        assert_eq!(r.status, 403, "{method}: {}", r.body);
        assert_eq!(
            r.error(),
            "runtime limits are off: set SLUICE_ADMIN_TOKEN_FILE to a file of bearer tokens"
        );
    }
    let (status, st) = s.decide(&[("tenant", "acme")]);
    assert_eq!((status, requests_per_unit(&st)), (200, Some(100)), "{st}");
}

/// A YAML reload keeps the runtime limits: over the new YAML, still first at their paths;
/// a runtime limit deleted after the reload gives way to the new YAML's limit, not the old.
#[test]
fn a_yaml_reload_keeps_the_runtime_limits() {
    let files = Files::new();
    let mut c = files.sluice();
    c.env("SLUICE_CONFIG_POLL_MS", "100");
    let s = Sluice::start(&files, c);
    for (path, body) in [
        ("tenant=acme", TWO_A_MINUTE),
        ("tenant=initech", r#"{"unit":"hour","requests_per_unit":5}"#),
    ] {
        let r = s.api("PUT", &format!("/limits/edge/{path}"), OPS, body);
        assert_eq!(r.status, 201, "{path}: {}", r.body);
    }

    // tenant=acme 50 a minute; umbrella gone, hooli new.
    files.write_yaml(
        "domain: edge
descriptors:
  - key: tenant
    value: acme
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: tenant
    value: hooli
    rate_limit: {unit: hour, requests_per_unit: 7}
",
    );
    wait_for("the new YAML", Duration::from_secs(15), || {
        s.explained("tenant=hooli")["blocks"][0]["requests_per_unit"] == 7
    });
    let limit = |d: &str| {
        let l = s.explained(d);
        (
            l["source"].as_str().map(str::to_owned),
            l["blocks"][0]["requests_per_unit"].as_u64(),
        )
    };
    assert_eq!(limit("tenant=acme"), (Some("runtime".into()), Some(2)));
    assert_eq!(limit("tenant=initech"), (Some("runtime".into()), Some(5)));
    assert_eq!(
        limit("tenant=umbrella"),
        (None, None),
        "gone with the old YAML"
    );
    let (_, st) = s.decide(&[("tenant", "acme")]);
    assert_eq!(requests_per_unit(&st), Some(2), "{st}");
    let listed = s.api("GET", "/limits/edge", OPS, "").json();
    assert_eq!(
        listed["limits"].as_array().map(Vec::len),
        Some(2),
        "{listed}"
    );

    let r = s.api("DELETE", "/limits/edge/tenant=acme", OPS, "");
    assert_eq!(r.status, 204, "{}", r.body);
    assert_eq!(limit("tenant=acme"), (Some("config".into()), Some(50)));
    let (_, st) = s.decide(&[("tenant", "acme")]);
    assert_eq!(requests_per_unit(&st), Some(50), "the new YAML's: {st}");
    let stats = s.text("/stats");
    assert!(
        stats.contains("ratelimit.service.config_load_success: 2"),
        "the start and the reload: {stats}"
    );
}

/// What shows a runtime limit: `/rlconfig` (`, source: runtime`), `/debug/explain` and
/// `sluice explain --json` (`"source": "runtime"`), `/metrics` (how many are set, and the
/// changes by op, a failed or dry-run call not counted), and `_history` (who, by the token's
/// name, and the limit before and after).
#[test]
fn rlconfig_explain_metrics_and_history_show_runtime_limits() {
    let files = Files::new();
    let s = Sluice::start(&files, files.sluice());
    let metrics = s.text("/metrics");
    assert_eq!(metric(&metrics, "sluice_runtime_limits"), Some(0.0));
    make_changes(&s);

    let rlconfig = s.text("/rlconfig");
    assert!(
        rlconfig.contains(
            "edge.tenant_hooli: unit=MINUTE requests_per_unit=4, shadow_mode: false, quota_mode: false, source: runtime\n"
        ),
        "{rlconfig}"
    );
    assert!(
        rlconfig.contains(
            "edge.tenant_acme: unit=MINUTE requests_per_unit=100, shadow_mode: false, quota_mode: false\n"
        ),
        "the YAML's lines as Go writes them: {rlconfig}"
    );
    assert_eq!(rlconfig.matches("source: runtime").count(), 1, "{rlconfig}");
    assert!(
        !rlconfig.contains("globex"),
        "a dry run sets nothing: {rlconfig}"
    );

    let limit = s.explained("tenant=hooli");
    assert_eq!(
        (&limit["source"], &limit["blocks"][0]["requests_per_unit"]),
        (&json!("runtime"), &json!(4)),
        "{limit}"
    );
    assert_eq!(s.explained("tenant=acme")["source"], "config");
    let out = Command::new(BIN)
        .env_clear()
        .args(["explain", "--json", "--domain", "edge", "--descriptor"])
        .arg("tenant=hooli")
        .arg("--debug-address")
        .arg(format!("127.0.0.1:{}", s.debug))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["descriptors"][0]["limit"]["source"], "runtime", "{v}");

    let metrics = s.text("/metrics");
    for (name, value) in [
        ("sluice_runtime_limits", 1.0),
        ("sluice_runtime_limit_changes_total{op=\"put\"}", 3.0),
        ("sluice_runtime_limit_changes_total{op=\"delete\"}", 1.0),
    ] {
        assert_eq!(metric(&metrics, name), Some(value), "{name} in:\n{metrics}");
    }

    history_names_the_tokens(&s);
}

/// Changes on behalf of two tokens: two created, one replaced, one removed; a removal of
/// nothing, a dry run and a bad body, which change nothing.
fn make_changes(s: &Sluice) {
    let calls: [(&str, &str, Option<&str>, &str, u16); 7] = [
        ("PUT", "/limits/edge/tenant=hooli", OPS, TWO_A_MINUTE, 201),
        (
            "PUT",
            "/limits/edge/tenant=initech/path",
            UNNAMED,
            r#"{"unit":"second","requests_per_unit":9,"algorithm":"sliding_window"}"#,
            201,
        ),
        (
            "PUT",
            "/limits/edge/tenant=hooli",
            OPS,
            r#"{"unit":"minute","requests_per_unit":4}"#,
            200,
        ),
        ("DELETE", "/limits/edge/tenant=initech/path", OPS, "", 204),
        ("DELETE", "/limits/edge/tenant=initech/path", OPS, "", 404),
        (
            "PUT",
            "/limits/edge/tenant=globex?dry_run=true",
            OPS,
            TWO_A_MINUTE,
            200,
        ),
        (
            "PUT",
            "/limits/edge/tenant=globex",
            OPS,
            r#"{"unit":"minute","requests_per_unit":-1}"#,
            400,
        ),
    ];
    for (method, path, token, body, status) in calls {
        let r = s.api(method, path, token, body);
        assert_eq!(r.status, status, "{method} {path}: {}", r.body);
        if path.ends_with("dry_run=true") {
            let v = r.json();
            assert_eq!(
                (&v["dry_run"], &v["would"]),
                (&json!(true), &json!("create"))
            );
            let limit = &v["explain"]["descriptors"][0]["limit"];
            assert_eq!(limit["source"], "runtime", "{v}");
            assert_eq!(limit["blocks"][0]["requests_per_unit"], 2, "{v}");
        }
    }
}

/// `_history` after [`make_changes`]: who (the token's name), what, where, before and after.
fn history_names_the_tokens(s: &Sluice) {
    let history = s.api("GET", "/limits/_history", OPS, "").json();
    let records = history.as_array().unwrap();
    let seen: Vec<(&str, &str, &str)> = records
        .iter()
        .map(|r| {
            (
                r["who"].as_str().unwrap(),
                r["op"].as_str().unwrap(),
                r["path"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("ops", "put", "tenant=hooli"),
            ("token 3", "put", "tenant=initech/path"),
            ("ops", "put", "tenant=hooli"),
            ("ops", "delete", "tenant=initech/path"),
        ],
        "{history}"
    );
    let replaced = &records[2];
    assert_eq!(replaced["domain"], "edge");
    assert_eq!(
        replaced["old"],
        json!({"unit": "minute", "requests_per_unit": 2})
    );
    assert_eq!(
        replaced["new"],
        json!({"unit": "minute", "requests_per_unit": 4})
    );
    assert_eq!(records[3]["new"], Value::Null);
    let time = records[0]["time"].as_str().unwrap();
    assert!(
        time.len() >= 20 && time.starts_with("20") && time.ends_with('Z'),
        "an RFC 3339 time: {time}"
    );
}

/// The API's errors on the real port, a sample (the unit tests answer every one): 401 with
/// `WWW-Authenticate: Bearer`, 403, 400 with the YAML's own message, 413, 405 with `Allow`,
/// and 404; each a JSON `{"error": ...}`.
#[test]
fn the_apis_errors_arrive_on_the_real_port() {
    let files = Files::new();
    let s = Sluice::start(&files, files.sluice());
    let path = "/limits/edge/tenant=acme";

    let r = s.api("PUT", path, None, TWO_A_MINUTE);
    assert_eq!(r.status, 401, "{}", r.body);
    assert_eq!(r.header("www-authenticate"), Some("Bearer"), "{r:?}");
    assert!(r.error().contains("Authorization: Bearer"), "{}", r.body);
    let r = call(s.debug, "GET", path, Some("Basic b3BzOnMzY3IzdA=="), b"");
    assert_eq!(r.status, 401, "not a bearer token: {}", r.body);

    let r = s.api("PUT", path, Some("guess"), TWO_A_MINUTE);
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(r.header("www-authenticate"), None);
    assert_eq!(
        r.error(),
        "the bearer token is not one of SLUICE_ADMIN_TOKEN_FILE's"
    );

    let r = s.api(
        "PUT",
        path,
        OPS,
        r#"{"unit":"fortnight","requests_per_unit":2}"#,
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.error(), "invalid rate limit unit 'fortnight'");
    let r = s.api("PUT", path, OPS, "{nope");
    assert_eq!(r.status, 400);
    assert!(
        r.error().starts_with("the body is not JSON: "),
        "{}",
        r.body
    );
    let r = s.api("PUT", "/limits/edge/tenant=a*", OPS, TWO_A_MINUTE);
    assert_eq!(r.status, 400);
    assert!(r.error().contains("cannot contain '*'"), "{}", r.body);
    let r = s.api("GET", "/limits/edge?limit=0", OPS, "");
    assert_eq!(r.status, 400);
    assert!(
        r.error().starts_with("limit=0: expected a number"),
        "{}",
        r.body
    );

    // A body over 64 KiB, refused for its size whatever it holds: one byte over, so the
    // server has read it all when it answers (the unread rest of a larger one could reset the
    // connection before this client reads the answer).
    let head = r#"{"unit":"minute","requests_per_unit":2,"name":""#;
    let big = format!("{head}{}\"}}", "n".repeat(64 * 1024 + 1 - head.len() - 2));
    assert_eq!(big.len(), 64 * 1024 + 1);
    let r = s.api("PUT", path, OPS, &big);
    assert_eq!(r.status, 413, "{}", r.body);
    assert_eq!(r.error(), "the body is larger than 65536 bytes");

    let r = s.api("POST", path, OPS, TWO_A_MINUTE);
    assert_eq!(r.status, 405, "{}", r.body);
    assert_eq!(r.header("allow"), Some("GET, PUT, DELETE"));
    assert_eq!(r.error(), "this path takes GET, PUT, DELETE");
    let r = s.api("DELETE", "/limits/_history", OPS, "");
    assert_eq!((r.status, r.header("allow")), (405, Some("GET")));

    let r = s.api("GET", path, OPS, "");
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(r.error(), "no runtime limit at edge/tenant=acme");
    assert_eq!(s.api("DELETE", path, OPS, "").status, 404);
}

/// A PUT refused for what other limits hold: 507 for a new path past
/// SLUICE_MAX_RUNTIME_LIMITS (a change of a limit held is not refused), and 400 with the
/// YAML's message for a path whose node another path has (`tenant_acme` and `tenant=acme`,
/// both the composite key `tenant_acme`), which is not that limit to read or delete either.
#[test]
fn a_put_past_the_cap_or_at_another_paths_node_is_refused() {
    let files = Files::new();
    let mut c = files.sluice();
    c.env("SLUICE_MAX_RUNTIME_LIMITS", "1");
    let s = Sluice::start(&files, c);
    let path = "/limits/edge/tenant=acme";
    assert_eq!(s.api("PUT", path, OPS, TWO_A_MINUTE).status, 201);
    let twin = "/limits/edge/tenant_acme";
    let r = s.api(
        "PUT",
        twin,
        OPS,
        r#"{"unit":"second","requests_per_unit":1}"#,
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(
        r.error(),
        "duplicate descriptor composite key 'edge.tenant_acme' (the runtime limit at tenant=acme has it)"
    );
    assert_eq!(s.api("GET", twin, OPS, "").status, 404);
    assert_eq!(s.api("DELETE", twin, OPS, "").status, 404);
    assert_eq!(
        s.api("DELETE", &format!("{twin}?dry_run"), OPS, "").status,
        404
    );
    assert_eq!(
        s.api("GET", path, OPS, "").json(),
        json!({"unit": "minute", "requests_per_unit": 2})
    );
    let r = s.api("PUT", "/limits/edge/tenant=hooli", OPS, TWO_A_MINUTE);
    assert_eq!(r.status, 507, "{}", r.body);
    assert!(r.error().contains('1'), "{}", r.body);
    let r = s.api(
        "PUT",
        path,
        OPS,
        r#"{"unit":"minute","requests_per_unit":3}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);

    // None of the refused calls changed anything.
    let listed = s.api("GET", "/limits/edge", OPS, "").json();
    assert_eq!(
        listed["limits"],
        json!([{"path": "tenant=acme", "limit": {"unit": "minute", "requests_per_unit": 3}}])
    );
}
