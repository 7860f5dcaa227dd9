//! End-to-end tests of the real `sluice` binary: start-up validation and exit codes,
//! `check-config`, the runtime directory layout with a Kubernetes ConfigMap-style symlink swap,
//! a rejected reload, and SIGTERM handling. Every process is started on 127.0.0.1 on free
//! ports and killed when its guard drops; every wait is bounded.

mod pki;
mod support;

use support::{free_port, http, wait_for};

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// Environment variables the host may have set that would change what these tests see.
const SCRUBBED: &[&str] = &[
    "GRPC_SERVER_USE_TLS",
    "REDIS_URL",
    "BACKEND_TYPE",
    "RUNTIME_ROOT",
    "SLUICE_CONFIG",
    "PORT",
    "GRPC_PORT",
    "DEBUG_PORT",
    "LOG_LEVEL",
];

fn sluice() -> Command {
    let mut c = Command::new(BIN);
    for v in SCRUBBED {
        c.env_remove(v);
    }
    c.stdin(Stdio::null());
    c
}

fn run(mut c: Command) -> Output {
    c.output().expect("run sluice")
}

/// Kills the child when dropped, so a failing test leaves no process behind.
struct Server {
    child: Child,
    http: u16,
    debug: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(configure: impl FnOnce(&mut Command)) -> Server {
    let (http_port, grpc, debug) = (free_port(), free_port(), free_port());
    let mut c = sluice();
    c.env("HOST", "127.0.0.1")
        .env("GRPC_HOST", "127.0.0.1")
        .env("DEBUG_HOST", "127.0.0.1")
        .env("PORT", http_port.to_string())
        .env("GRPC_PORT", grpc.to_string())
        .env("DEBUG_PORT", debug.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    configure(&mut c);
    let child = c.spawn().expect("spawn sluice");
    let server = Server {
        child,
        http: http_port,
        debug,
    };
    wait_for("the HTTP listener", Duration::from_secs(20), || {
        http(server.http, "GET", "/healthcheck", "").is_some()
    });
    server
}

fn json(port: u16, domain: &str, key: &str, value: &str) -> (u16, String) {
    let body = format!(
        r#"{{"domain":"{domain}","descriptors":[{{"entries":[{{"key":"{key}","value":"{value}"}}]}}]}}"#
    );
    http(port, "POST", "/json", &body).expect("answer from /json")
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

const GOOD: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";

#[test]
fn help_shows_the_environment_variable_beside_each_flag() {
    let mut c = sluice();
    c.arg("--help");
    let out = run(c);
    assert!(out.status.success());
    // Help text wraps at the terminal width; compare with whitespace runs collapsed.
    let help = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    for var in [
        "GRPC_PORT",
        "PORT",
        "DEBUG_PORT",
        "RUNTIME_ROOT",
        "SHADOW_MODE",
        "LOG_LEVEL",
    ] {
        assert!(
            help.contains(&format!("[env: {var}=")),
            "{var} missing from:\n{help}"
        );
    }
}

/// Starts `sluice` with `var=value` and checks it stops with exit 64, saying `expected`.
fn refused(var: &str, value: &str, expected: &str) {
    let mut c = sluice();
    c.env(var, value);
    let out = run(c);
    assert_eq!(out.status.code(), Some(64), "{var}={value}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(expected), "{err}");
}

#[test]
fn a_malformed_setting_stops_start_up_naming_the_variable() {
    refused("PORT", "eighty", "PORT");
    refused("SHADOW_MODE", "maybe", "SHADOW_MODE");
}

#[test]
fn grpc_tls_is_refused_rather_than_served_in_clear() {
    refused("GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_USE_TLS=true");
}

#[test]
fn a_redis_backend_without_an_address_is_refused() {
    refused("BACKEND_TYPE", "redis", "REDIS_URL");
}

#[test]
fn write_behind_without_peers_is_refused() {
    refused(
        "SLUICE_PEER_WRITE_BEHIND",
        "true",
        "SLUICE_PEER_WRITE_BEHIND=true: needs PEERS or PEERS_DNS",
    );
}

#[test]
fn a_bad_config_stops_start_up_before_any_port_is_bound() {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("bad.yaml"),
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: foo, requests_per_unit: 1}\n",
    );
    let port = free_port();
    let mut c = sluice();
    c.arg("--config")
        .arg(dir.path())
        .env("HOST", "127.0.0.1")
        .env("PORT", port.to_string());
    let out = run(c);
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.yaml: invalid rate limit unit 'foo'"),
        "{err}"
    );
}

#[test]
fn check_config_prints_every_error_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("a.yaml"), "domain: ''\n");
    write(&dir.path().join("b.yaml"), "domain: b\nratelimit: 1\n");
    let mut c = sluice();
    c.arg("check-config").arg(dir.path());
    let out = run(c);
    assert_eq!(out.status.code(), Some(1));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("a.yaml: config file cannot have empty domain"),
        "{text}"
    );
    assert!(
        text.contains("b.yaml: config error, unknown key 'ratelimit'"),
        "{text}"
    );

    let good = tempfile::tempdir().unwrap();
    write(&good.path().join("ok.yaml"), GOOD);
    let mut c = sluice();
    c.arg("check-config").arg(good.path());
    let out = run(c);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn check_config_strict_envoy_reports_extensions_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("ext.yaml"),
        "domain: d\ndescriptors:\n  - key: k\n    value: v\n    descriptors:\n      - key: key2\n        rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 20}\n  - key: multi\n    rate_limits:\n      - {unit: second, requests_per_unit: 10}\n      - {unit: day, requests_per_unit: 10000, algorithm: fixed_window}\n",
    );
    write(
        &dir.path().join("go.yaml"),
        GOOD.replace("domain: d", "domain: g").as_str(),
    );

    // Without the flag the extended file is simply valid.
    let mut c = sluice();
    c.arg("check-config").arg(dir.path());
    let out = run(c);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let mut c = sluice();
    c.arg("check-config").arg("--strict-envoy").arg(dir.path());
    let out = run(c);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let tail = "which envoyproxy/ratelimit does not understand";
    let expected = [
        format!("ext.yaml: descriptor 'd.k_v.key2' uses 'algorithm: token_bucket', {tail}"),
        format!("ext.yaml: descriptor 'd.k_v.key2' uses 'burst: 20', {tail}"),
        format!("ext.yaml: descriptor 'd.multi' uses 'rate_limits', {tail}"),
        format!("ext.yaml: descriptor 'd.multi' uses 'algorithm: fixed_window', {tail}"),
    ];
    assert_eq!(
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .collect::<Vec<_>>(),
        expected
    );

    // Validation errors are still printed, before the extension uses.
    write(&dir.path().join("bad.yaml"), "domain: ''\n");
    let mut c = sluice();
    c.arg("check-config").arg("--strict-envoy").arg(dir.path());
    let out = run(c);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(
        lines[0], "bad.yaml: config file cannot have empty domain",
        "{err}"
    );
    assert_eq!(lines[1..], expected, "{err}");

    // A plain envoyproxy/ratelimit file passes.
    let mut c = sluice();
    c.arg("check-config")
        .arg("--strict-envoy")
        .arg(dir.path().join("go.yaml"));
    let out = run(c);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("go.yaml: OK (1 domains)"));
}

#[test]
fn the_default_config_directory_is_loaded_and_valid() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut c = sluice();
    c.arg("check-config").arg(repo.join("config"));
    let out = run(c);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // With no --config and no RUNTIME_ROOT, `sluice` serves ./config.
    let server = start(|c| {
        c.current_dir(repo);
    });
    let (status, body) = json(server.http, "edge", "remote_address", "10.0.0.1");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"requestsPerUnit\":20"), "{body}");
}

/// Lays out a Kubernetes ConfigMap mount: `root/config/..data -> ..v<N>`, and
/// `root/config/<file> -> ..data/<file>`. Returns the directory holding the version dirs.
fn configmap_version(app_dir: &Path, version: u32, files: &[(&str, &str)]) {
    let versioned = app_dir.join(format!("..v{version}"));
    std::fs::create_dir_all(&versioned).unwrap();
    for (name, text) in files {
        write(&versioned.join(name), text);
    }
    // Swap `..data` atomically, as the kubelet does: new symlink, then rename over.
    let tmp = app_dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(format!("..v{version}"), &tmp).unwrap();
    std::fs::rename(&tmp, app_dir.join("..data")).unwrap();
    for (name, _) in files {
        let link = app_dir.join(name);
        if link.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), &link).unwrap();
        }
    }
}

#[test]
fn runtime_layout_reloads_on_a_configmap_swap_and_keeps_serving_on_a_bad_one() {
    let root = tempfile::tempdir().unwrap();
    let app_dir = root.path().join("current/config");
    configmap_version(&app_dir, 1, &[("limits.yaml", GOOD)]);
    let server = start(|c| {
        c.env("RUNTIME_ROOT", root.path().join("current"))
            .env("RUNTIME_SUBDIRECTORY", "")
            .env("RUNTIME_APPDIRECTORY", "config");
    });
    let (status, body) = json(server.http, "d", "k", "v");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"requestsPerUnit\":2"), "{body}");
    // One more hit: the counter is at 2 of 2.
    json(server.http, "d", "k", "v");

    // New version: a limit of 5 on the same key. The counter survives the reload.
    let five = GOOD.replace("requests_per_unit: 2", "requests_per_unit: 5");
    configmap_version(&app_dir, 2, &[("limits.yaml", &five)]);
    wait_for("the swapped config", Duration::from_secs(10), || {
        json(server.http, "d", "k", "peek")
            .1
            .contains("\"requestsPerUnit\":5")
    });
    let (_, body) = json(server.http, "d", "k", "v");
    assert!(
        body.contains("\"limitRemaining\":2"),
        "counter kept: {body}"
    );

    // A broken version is rejected; the old config keeps serving, and the error is counted.
    configmap_version(
        &app_dir,
        3,
        &[("limits.yaml", "domain: d\ndescriptors: [1]\n")],
    );
    wait_for(
        "the rejected reload to be counted",
        Duration::from_secs(10),
        || {
            http(server.debug, "GET", "/stats", "")
                .is_some_and(|(_, b)| b.contains("ratelimit.service.config_load_error: 1"))
        },
    );
    let (status, body) = json(server.http, "d", "k", "other");
    assert_eq!(status, 200);
    assert!(body.contains("\"requestsPerUnit\":5"), "{body}");
}

#[test]
fn sigterm_fails_health_then_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("ok.yaml"), GOOD);
    let mut server = start(|c| {
        c.arg("--config")
            .arg(dir.path())
            .env("SLUICE_SHUTDOWN_DELAY_SECS", "2");
    });
    assert_eq!(http(server.http, "GET", "/healthcheck", "").unwrap().0, 200);
    let pid = server.child.id().to_string();
    let kill = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(kill.success());
    wait_for("health to fail", Duration::from_secs(5), || {
        http(server.http, "GET", "/healthcheck", "").is_some_and(|(s, _)| s == 500)
    });
    let start = Instant::now();
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "sluice did not exit"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
