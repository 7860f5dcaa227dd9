//! What every end-to-end test shares about real processes: outside programs found or the test
//! failed (or skipped, on record), free loopback ports, bounded waits, and the timing of real
//! windows. (Its HTTP client is [`crate::http`].)

#![allow(
    clippy::disallowed_methods,
    reason = "tests time real processes, sockets and deadlines; Sluice's code reads time through crate::clock"
)]
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Whether the environment variable `name` is set to a true value: `1` or `true` (any case).
/// The one reading of `CI` and `SLUICE_REQUIRE_TOOLS` in every test (and in the Python tests,
/// `integration/tools.py`).
pub fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// Whether a missing outside program fails a test rather than skipping it: under the test
/// command (`scripts/test.sh` exports `SLUICE_REQUIRE_TOOLS=1`) and under CI (`CI=true`).
pub fn tools_required() -> bool {
    env_flag("SLUICE_REQUIRE_TOOLS") || env_flag("CI")
}

/// A test cannot run here because `program` is missing; `install` says how to get it. When
/// tools are required ([`tools_required`]) the test fails, naming both; otherwise the skip is
/// said on stderr and appended to `target/skipped.txt`, which `scripts/test.sh` prints at its
/// end (libtest hides a passing test's stderr, so the file is what a reader sees). Returns
/// `false`, for `found || missing(...)`.
pub fn missing(program: &str, install: &str) -> bool {
    let test = std::thread::current()
        .name()
        .filter(|n| *n != "main")
        .map(str::to_owned)
        .unwrap_or_else(|| "a test".to_owned());
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|stem| {
            stem.rsplit_once('-')
                .map_or(stem.clone(), |(name, _)| name.to_owned())
        })
        .unwrap_or_default();
    let why = format!("{program} not found: {install}");
    if tools_required() {
        panic!(
            "{binary} {test}: {why}\n(SLUICE_REQUIRE_TOOLS=1, set by scripts/test.sh, or CI=true \
             makes a missing program a failure; without them the test is skipped)"
        );
    }
    eprintln!("\n*** SKIPPED {binary} {test}: {why} ***\n");
    let record = skip_record();
    let line = format!("{binary} {test}: {why}\n");
    // One write of one short line to a file opened for appending: parallel tests' lines do
    // not interleave.
    let written = record
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&record)
                .and_then(|mut f| f.write_all(line.as_bytes()))
        });
    if let Err(e) = written {
        eprintln!("cannot record the skip in {}: {e}", record.display());
    }
    false
}

/// The repository's root: where `Cargo.toml`, `config/`, `docs/` and `tests/fixtures/` are.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("tests/support sits two levels below the repository's root")
        .to_path_buf()
}

/// Where skips are recorded: SLUICE_SKIPPED_FILE (the rule's own test points it elsewhere),
/// else `target/skipped.txt` in the repository.
pub fn skip_record() -> PathBuf {
    std::env::var_os("SLUICE_SKIPPED_FILE")
        .filter(|p| !p.is_empty())
        .map_or_else(|| repo().join("target/skipped.txt"), PathBuf::from)
}

/// Whether `program arg` runs and succeeds; if not, [`missing`] with `install`.
pub fn tool_available(program: &str, arg: &str, install: &str) -> bool {
    let found = std::process::Command::new(program)
        .arg(arg)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    found || missing(program, install)
}

/// A port that was free on 127.0.0.1 a moment ago, for a process the test starts.
///
/// Chosen below the kernel's ephemeral range, so no outgoing connection (a peer reconnecting to
/// a node the test killed, say) can take it as its source port before the process binds it,
/// and never the same port twice in one test binary.
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| {
            r.split_whitespace()
                .next()
                .and_then(|p| p.parse::<u16>().ok())
        })
        .unwrap_or(32768);
    let (from, to) = (10_000u16, low.max(12_000));
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    // A cheap varying start, so parallel test binaries rarely probe the same ports.
    let span = u32::from(to - from);
    let seed = std::process::id().wrapping_mul(2_654_435_761)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
    for i in 0..span {
        let port = from + ((seed.wrapping_add(i.wrapping_mul(7919))) % span) as u16;
        if handed_out.contains(&port) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed_out.push(port);
            return port;
        }
    }
    panic!("no free port between {from} and {to}");
}

/// Polls `f` every 50 ms until it holds; panics naming `what` after `timeout`.
pub fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

/// A ShouldRateLimit request for domain `d`, one descriptor `k=v`: what the gRPC tests send.
pub fn request_d_k_v() -> envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
        domain: "d".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "k".into(),
                value: "v".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

/// Waits, if needed, until at least `needed` seconds remain in the current epoch-aligned minute,
/// so a test that counts hits in a real process's MINUTE window across a reload (which takes a
/// poll interval or two) does not see the window roll over and its count restart. Waits at
/// most `needed` seconds.
pub fn with_minute_to_spare(needed: u64) {
    with_window_to_spare(60, needed);
}

/// [`with_minute_to_spare`] for an epoch-aligned window of `window` seconds (3600: an hour).
pub fn with_window_to_spare(window: u64, needed: u64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970");
    let into = now.as_secs() % window;
    if window - into < needed {
        std::thread::sleep(
            Duration::from_secs(window - into)
                - Duration::from_nanos(u64::from(now.subsec_nanos()))
                + Duration::from_millis(100),
        );
    }
}

/// Milliseconds since the epoch, by the system clock the Sluice processes read too.
pub fn unix_millis() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970");
    u64::try_from(now.as_millis()).unwrap_or(u64::MAX)
}

/// `promtool check metrics` on an exposition; a missing promtool is [`missing`] (a
/// failure under the test command and CI).
pub fn promtool_check(text: &str) {
    use std::process::{Command, Stdio};
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        missing(
            "promtool",
            "apt-get install prometheus (scripts/test.sh does)",
        );
        return;
    };
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool runs");
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}\n--- exposition ---\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
}
