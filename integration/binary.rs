//! End-to-end tests of the real `sluice` binary: start-up validation and exit codes,
//! `check-config`, the runtime directory layout with a Kubernetes ConfigMap-style symlink swap,
//! a rejected reload, and SIGTERM handling. Every process is started on 127.0.0.1 on free
//! ports and killed when its guard drops; every wait is bounded.

#![allow(
    clippy::disallowed_methods,
    reason = "tests time real processes, sockets and deadlines; Sluice's code reads time through crate::clock"
)]

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use sluice_test_support::http::http;
use sluice_test_support::process::{free_port, wait_for};
use sluice_test_support::{pki, process};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// Environment variables the host may have set that would change what these tests see.
const SCRUBBED: &[&str] = &[
    "GRPC_SERVER_USE_TLS",
    "GRPC_SERVER_TLS_CERT",
    "GRPC_SERVER_TLS_KEY",
    "GRPC_CLIENT_TLS_CACERT",
    "GRPC_CLIENT_TLS_SAN",
    "CONFIG_TYPE",
    "CONFIG_GRPC_XDS_SERVER_USE_TLS",
    "CONFIG_GRPC_XDS_SERVER_URL",
    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
    "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
    "REDIS_URL",
    "BACKEND_TYPE",
    "RUNTIME_ROOT",
    "SLUICE_CONFIG",
    "PORT",
    "GRPC_PORT",
    "DEBUG_PORT",
    "LOG_LEVEL",
    "TRACING_ENABLED",
    "TRACING_SAMPLING_RATE",
    "TRACING_EXPORTER_PROTOCOL",
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_INSECURE",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_SDK_DISABLED",
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
    grpc: u16,
    debug: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(configure: impl FnOnce(&mut Command)) -> Server {
    start_command(sluice(), configure)
}

/// [`start`] with a command of the caller's (one that runs sluice through a shell, say).
fn start_command(mut c: Command, configure: impl FnOnce(&mut Command)) -> Server {
    let (http_port, grpc, debug) = (free_port(), free_port(), free_port());
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
        grpc,
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

/// A misspelt Sluice setting would otherwise start a node that is not what was asked for.
#[test]
fn a_misspelt_sluice_variable_stops_start_up_naming_the_setting_meant() {
    refused(
        "SLUICE_CLUSTR_MODE",
        "lease",
        "SLUICE_CLUSTR_MODE is not a Sluice setting; did you mean SLUICE_CLUSTER_MODE?",
    );
    refused(
        "SLUICE_MAX_CONECTIONS",
        "5",
        "SLUICE_MAX_CONECTIONS is not a Sluice setting; did you mean SLUICE_MAX_CONNECTIONS?",
    );
    // The Go service's variables keep its leniency: an unknown one is ignored, as in Go.
    let dir = config_dir();
    let _server = start(|c| {
        c.arg("--config").arg(dir.path()).env("REDIS_URLL", "x");
    });
}

/// Stands for any test whose outside program is missing; run only as a child of the test
/// below, which sets its environment.
#[test]
#[ignore = "run by a_missing_program_fails_under_the_test_command_and_is_recorded_otherwise"]
fn needs_a_program_nobody_installs() {
    assert!(
        !process::tool_available("sluice-no-such-program", "--version", "nothing installs it"),
        "a program that should not exist was found"
    );
}

/// `process::missing`, the one rule for a test whose program is missing: under the test
/// command (SLUICE_REQUIRE_TOOLS) or CI, read `1` or `true` in any case, the test fails naming
/// the program and how to install it; otherwise it passes and the skip is on record.
#[test]
fn a_missing_program_fails_under_the_test_command_and_is_recorded_otherwise() {
    let record_dir = tempfile::tempdir().unwrap();
    let record = record_dir.path().join("skipped.txt");
    let run = |var: &str, value: &str| {
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.args(["--exact", "needs_a_program_nobody_installs", "--ignored"])
            .env_remove("SLUICE_REQUIRE_TOOLS")
            .env_remove("CI")
            .env("SLUICE_SKIPPED_FILE", &record)
            .env(var, value);
        run(c)
    };
    for (var, value) in [
        ("SLUICE_REQUIRE_TOOLS", "1"),
        ("SLUICE_REQUIRE_TOOLS", "TRUE"),
        ("CI", "true"),
        ("CI", "1"),
    ] {
        let out = run(var, value);
        let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{var}={value}: passed\n{said}");
        assert!(
            said.contains("sluice-no-such-program not found: nothing installs it"),
            "{var}={value}:\n{said}"
        );
        assert!(
            !record.exists(),
            "{var}={value}: a failure was recorded as a skip"
        );
    }
    let out = run("SLUICE_REQUIRE_TOOLS", "0");
    assert!(out.status.success(), "{out:?}");
    let recorded = std::fs::read_to_string(&record).expect("the skip is recorded");
    assert_eq!(
        recorded.lines().collect::<Vec<_>>(),
        [
            "binary needs_a_program_nobody_installs: sluice-no-such-program not found: nothing installs it"
        ]
    );
}

#[test]
fn go_variables_sluice_cannot_honour_stop_start_up() {
    refused("EXTRA_TAGS", "env:prod", "EXTRA_TAGS=env:prod: ");
    refused("USE_DOG_STATSD", "true", "USE_DOG_STATSD=true: ");
}

#[test]
fn grpc_tls_without_a_certificate_is_refused_rather_than_served_in_clear() {
    refused(
        "GRPC_SERVER_USE_TLS",
        "true",
        "GRPC_SERVER_TLS_CERT=: must name a PEM file when GRPC_SERVER_USE_TLS is true",
    );
}

#[test]
fn a_redis_backend_without_an_address_is_refused() {
    refused("BACKEND_TYPE", "redis", "REDIS_URL");
}

/// REDIS_URL as host:port under the unix socket type (the default, as in Go): start-up fails,
/// as in Go, and the message says what to set.
#[test]
fn a_host_and_port_under_the_unix_socket_type_says_to_set_tcp() {
    let dir = config_dir();
    let mut c = sluice();
    c.arg("--config")
        .arg(dir.path())
        .env("BACKEND_TYPE", "redis")
        .env("REDIS_URL", "127.0.0.1:6379")
        .env("PORT", free_port().to_string())
        .env("GRPC_PORT", free_port().to_string())
        .env("DEBUG_PORT", free_port().to_string());
    let out = run(c);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("set REDIS_SOCKET_TYPE=tcp"), "{stderr}");
    assert!(!stderr.contains("sluice listening"), "{stderr}");
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

/// Issue 52: a bad `value_regex` stops start-up (exit 64) naming the file and the pattern;
/// `check-config --strict-envoy` lists `value_regex` and `penalty_seconds` as extensions.
#[test]
fn a_bad_value_regex_stops_start_up_and_patterns_and_penalties_are_extensions() {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("bad.yaml"),
        "domain: d\ndescriptors:\n  - key: k\n    value_regex: \"v(\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    );
    let mut c = sluice();
    c.arg("--config")
        .arg(dir.path())
        .env("HOST", "127.0.0.1")
        .env("PORT", free_port().to_string());
    let out = run(c);
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.yaml: invalid value_regex 'v(': "),
        "{err}"
    );

    let good = tempfile::tempdir().unwrap();
    write(
        &good.path().join("ext.yaml"),
        "domain: d\ndescriptors:\n  - key: k\n    value_regex: \"v[0-9]+\"\n    rate_limit: {unit: second, requests_per_unit: 3, penalty_seconds: 3}\n",
    );
    let mut c = sluice();
    c.arg("check-config").arg("--strict-envoy").arg(good.path());
    let out = run(c);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    for key in ["value_regex: v[0-9]+", "penalty_seconds: 3"] {
        assert!(err.contains(&format!("uses '{key}'")), "{key}: {err}");
    }
}

/// memcached cannot keep a concurrency limit's slots: start-up stops with exit 64 before a
/// port is bound, naming the file, the descriptor and the backend.
#[test]
fn a_concurrency_limit_on_memcached_stops_start_up() {
    let port = free_port();
    let mut c = sluice();
    c.arg("--config")
        .arg(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("examples/envoy-inflight/sluice-concurrency.yaml"),
        )
        .env("HOST", "127.0.0.1")
        .env("PORT", port.to_string())
        .env("BACKEND_TYPE", "memcache")
        .env("MEMCACHE_HOST_PORT", "127.0.0.1:1");
    let out = run(c);
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("sluice-concurrency.yaml: descriptor 'inflight' uses 'algorithm: concurrency', which BACKEND_TYPE=memcache cannot count"),
        "{err}"
    );
    assert!(
        std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(),
        "the port was bound"
    );
}

#[test]
fn config_size_caps_stop_start_up_and_fail_check_config() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("ok.yaml"), GOOD);
    // Sparse: 64 MiB by its metadata, no disk, and never read.
    let big = std::fs::File::create(dir.path().join("big.yaml")).unwrap();
    big.set_len(64 << 20).unwrap();
    let too_big = "big.yaml: error loading config file: 67108864 bytes is more than \
                   SLUICE_CONFIG_MAX_FILE_BYTES=4194304";

    let mut c = sluice();
    c.arg("--config")
        .arg(dir.path())
        .env("HOST", "127.0.0.1")
        .env("PORT", free_port().to_string());
    let out = run(c);
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(too_big), "{err}");
    assert!(
        err.contains("SLUICE_CONFIG_MAX_TOTAL_BYTES=8388608"),
        "{err}"
    );

    let mut c = sluice();
    c.arg("check-config").arg(dir.path());
    let out = run(c);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(too_big), "{err}");

    // check-config applies the service's caps, from the same variables.
    std::fs::remove_file(dir.path().join("big.yaml")).unwrap();
    let mut c = sluice();
    c.arg("check-config")
        .arg(dir.path())
        .env("SLUICE_CONFIG_MAX_FILE_BYTES", "10")
        .env("SLUICE_CONFIG_MAX_TOTAL_BYTES", "1000");
    let out = run(c);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ok.yaml: error loading config file: 87 bytes is more than SLUICE_CONFIG_MAX_FILE_BYTES=10"),
        "{err}"
    );
    refused(
        "SLUICE_CONFIG_SETTLE_MS",
        "60001",
        "SLUICE_CONFIG_SETTLE_MS=60001: must be between 0 and 60000",
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
fn check_config_rlqs_reports_limits_no_quota_bucket_reaches_in_the_key_order() {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("q.yaml"),
        "domain: q\ndescriptors:\n  - key: tenant\n    descriptors:\n      - key: plan\n        rate_limit: {unit: second, requests_per_unit: 10}\n",
    );
    let check = |order: &str| {
        let mut c = sluice();
        c.env("SLUICE_RLQS_KEY_ORDER", order)
            .arg("check-config")
            .arg("--rlqs")
            .arg(dir.path());
        run(c)
    };
    // Buckets map keys bytewise (plan, then tenant): `tenant > plan` is never reached.
    let out = check("");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("q.tenant.plan: no rate_limit_quota bucket reaches it: its keys are nested as tenant > plan"),
        "{err}"
    );
    // With tenant first, it is.
    let out = check("tenant");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A bad order is a usage error naming the variable.
    let out = check("tenant,,plan");
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("SLUICE_RLQS_KEY_ORDER"));
    // Without the flag the file is valid for ratelimit.v3.
    let mut c = sluice();
    c.arg("check-config").arg(dir.path());
    assert_eq!(run(c).status.code(), Some(0));
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
    // The counter must survive the reload within one MINUTE window (the reload waits for the
    // config poll, up to 10 s here).
    process::with_minute_to_spare(25);
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
    let dir = config_dir();
    let mut server = start(|c| {
        c.arg("--config")
            .arg(dir.path())
            .env("SLUICE_SHUTDOWN_DELAY_SECS", "2");
    });
    assert_eq!(http(server.http, "GET", "/healthcheck", "").unwrap().0, 200);
    let pid = server.child.id().to_string();
    signal(&pid, "TERM");
    wait_for("health to fail", Duration::from_secs(5), || {
        http(server.http, "GET", "/healthcheck", "").is_some_and(|(s, _)| s == 500)
    });
    let status = exit_within(&mut server.child, Duration::from_secs(20));
    assert!(status.success(), "exit status {status}");
}

/// At the default log level (WARN, as in Go), a start says what listens where on which config
/// and store, and a stop says why and that it ended; written to a file, the lines carry no
/// colour codes (a log collector would store them as they are).
#[test]
fn start_and_stop_are_logged_at_the_default_level() {
    let dir = config_dir();
    let log_dir = tempfile::tempdir().unwrap();
    let log = log_dir.path().join("stderr.log");
    let file = std::fs::File::create(&log).unwrap();
    let mut server = start(|c| {
        c.arg("--config")
            .arg(dir.path())
            .env_remove("NO_COLOR")
            .stderr(file);
    });
    let pid = server.child.id().to_string();
    signal(&pid, "TERM");
    let status = exit_within(&mut server.child, Duration::from_secs(20));
    assert!(status.success(), "exit status {status}");
    let text = std::fs::read_to_string(&log).unwrap();
    let listening = text
        .lines()
        .find(|l| l.contains("sluice listening"))
        .unwrap_or_else(|| panic!("no start line:\n{text}"));
    for field in [
        format!("http=127.0.0.1:{}", server.http),
        format!("grpc=127.0.0.1:{}", server.grpc),
        format!("debug=127.0.0.1:{}", server.debug),
        "domains=1".into(),
        "store=\"memory\"".into(),
    ] {
        assert!(listening.contains(&field), "{field} not in {listening}");
    }
    assert!(!listening.contains("spoa="), "{listening}");
    assert!(
        text.contains("sluice stopping") && text.contains("signal=\"SIGTERM\""),
        "{text}"
    );
    assert!(text.contains("sluice stopped"), "{text}");
    assert!(
        !text.contains('\x1b'),
        "escape codes in a log file:\n{text:?}"
    );
}

/// With LOG_FORMAT=json every line is JSON from the first one on: the format is set before
/// anything logs (envoyproxy/ratelimit's PR #1192 fixed its start-up lines, which came out as
/// text before the format was applied).
#[test]
fn with_log_format_json_every_line_is_json_from_the_first() {
    let dir = config_dir();
    let log_dir = tempfile::tempdir().unwrap();
    let log = log_dir.path().join("stderr.log");
    let file = std::fs::File::create(&log).unwrap();
    let mut server = start(|c| {
        c.arg("--config")
            .arg(dir.path())
            .env("LOG_FORMAT", "json")
            .env("LOG_LEVEL", "debug")
            .stderr(file);
    });
    signal(&server.child.id().to_string(), "TERM");
    let status = exit_within(&mut server.child, Duration::from_secs(20));
    assert!(status.success(), "exit status {status}");
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.len() >= 3, "{text}");
    for line in &lines {
        let parsed: Result<serde_json::Value, _> = serde_json::from_str(line);
        assert!(parsed.is_ok(), "not JSON: {line}\n{text}");
    }
    assert!(
        lines.iter().any(|l| l.contains("sluice listening")),
        "{text}"
    );
}

/// Sends `SIG<name>` to the process `pid`, asserting `kill` succeeded.
fn signal(pid: &str, name: &str) {
    let sent = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid)
        .status();
    assert!(sent.unwrap().success(), "kill -{name} {pid}");
}

/// Waits up to `limit` for the child to exit; its status.
fn exit_within(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            start.elapsed() < limit,
            "sluice did not exit within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sighup_loads_the_config_files_at_once() {
    let dir = config_dir();
    // Polling once a minute: only SIGHUP can make the change visible within the test.
    let server = start(|c| {
        c.arg("--config")
            .arg(dir.path())
            .env("SLUICE_CONFIG_POLL_MS", "60000");
    });
    let limit = |server: &Server| {
        let (status, body) = json(server.http, "d", "k", "sighup");
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["statuses"][0]["currentLimit"]["requestsPerUnit"].as_u64()
    };
    assert_eq!(limit(&server), Some(2));
    write(
        &dir.path().join("ok.yaml"),
        &GOOD.replace("requests_per_unit: 2", "requests_per_unit: 7"),
    );
    let pid = server.child.id().to_string();
    signal(&pid, "HUP");
    wait_for(
        "the new limit after SIGHUP",
        Duration::from_secs(10),
        || limit(&server) == Some(7),
    );
}

#[test]
fn a_second_sigterm_ends_the_drain_at_once() {
    let dir = config_dir();
    let mut server = start(|c| {
        c.arg("--config")
            .arg(dir.path())
            .env("SLUICE_SHUTDOWN_DELAY_SECS", "60");
    });
    let pid = server.child.id().to_string();
    let term = || signal(&pid, "TERM");
    term();
    wait_for("health to fail", Duration::from_secs(5), || {
        http(server.http, "GET", "/healthcheck", "").is_some_and(|(s, _)| s == 500)
    });
    // Still serving, for the 60 s shutdown delay...
    assert!(server.child.try_wait().unwrap().is_none());
    // ... until a second SIGTERM.
    term();
    let status = exit_within(&mut server.child, Duration::from_secs(10));
    assert!(status.success(), "exit status {status}");
}

// ---------------------------------------------------------------------------------------------
// gRPC over TLS: real processes, real sockets, a tonic client on rustls.

mod grpc_tls {
    use super::*;

    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use tonic::transport::{Channel, Endpoint};

    pub fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// A client's view of the listener: which CA it trusts, which name it expects, and the
    /// certificate it presents, if any.
    pub struct Client<'a> {
        pub ca: &'a Path,
        pub name: &'a str,
        pub identity: Option<&'a pki::Leaf>,
    }

    /// Connects over TLS; `Err` if the connection or handshake fails.
    pub async fn connect(port: u16, client: &Client<'_>) -> Result<Channel, String> {
        pki::tls_channel(port, client.ca, client.name, client.identity).await
    }

    /// One ShouldRateLimit call for `d`/`k`; the limit it reports, or the error.
    pub async fn limit(channel: Channel) -> Result<u32, String> {
        let request = process::request_d_k_v();
        let response = RateLimitServiceClient::new(channel)
            .should_rate_limit(request)
            .await
            .map_err(|e| format!("{e:?}"))?
            .into_inner();
        Ok(response
            .statuses
            .first()
            .and_then(|s| s.current_limit.as_ref())
            .map_or(0, |l| l.requests_per_unit))
    }

    /// Connect and call: with mTLS over TLS 1.3 the server judges the client's certificate
    /// after the client thinks the handshake is done, so a refusal may show on the first call.
    pub async fn call(port: u16, client: &Client<'_>) -> Result<u32, String> {
        limit(connect(port, client).await?).await
    }

    pub async fn plain_text_call(port: u16) -> Result<u32, String> {
        let channel = Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(|e| format!("{e:?}"))?;
        limit(channel).await
    }
}

use grpc_tls::{Client, call, runtime};

fn config_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("ok.yaml"), GOOD);
    dir
}

#[test]
fn grpc_over_tls_serves_trusting_clients_and_refuses_plain_text() {
    let pki = pki::TestPki::new();
    let leaf = pki.leaf("server", &["localhost", "127.0.0.1"]);
    let config = config_dir();
    let server = start(|c| {
        c.arg("--config")
            .arg(config.path())
            .env("GRPC_SERVER_USE_TLS", "true")
            .env("GRPC_SERVER_TLS_CERT", &leaf.cert)
            .env("GRPC_SERVER_TLS_KEY", &leaf.key);
    });
    let rt = runtime();
    let trusting = Client {
        ca: &pki.ca,
        name: "localhost",
        identity: None,
    };
    assert_eq!(rt.block_on(call(server.grpc, &trusting)), Ok(2));
    // Verified as an IP address too.
    let by_ip = Client {
        name: "127.0.0.1",
        ..trusting
    };
    assert_eq!(rt.block_on(call(server.grpc, &by_ip)), Ok(2));

    // Not verifiable: another CA, or a name the certificate does not carry.
    let other = pki::TestPki::new();
    let untrusting = Client {
        ca: &other.ca,
        name: "localhost",
        identity: None,
    };
    let e = rt.block_on(call(server.grpc, &untrusting)).unwrap_err();
    // Both test CAs are named "sluice test CA": the signature is what fails.
    assert!(e.contains("InvalidCertificate"), "{e}");
    let wrong_name = Client {
        ca: &pki.ca,
        name: "elsewhere.example",
        identity: None,
    };
    let e = rt.block_on(call(server.grpc, &wrong_name)).unwrap_err();
    assert!(e.contains("NotValidForName"), "{e}");

    // Plain text gets nothing.
    assert!(rt.block_on(grpc_tls::plain_text_call(server.grpc)).is_err());
    // None of that broke the listener.
    assert_eq!(rt.block_on(call(server.grpc, &trusting)), Ok(2));
}

#[test]
fn grpc_mtls_requires_a_client_certificate_from_the_ca_with_the_san() {
    let pki = pki::TestPki::new();
    let leaf = pki.leaf("server", &["localhost"]);
    let envoy = pki.leaf("envoy", &["envoy.client.example"]);
    let stranger = pki.leaf("stranger", &["stranger.example"]);
    let other = pki::TestPki::new();
    let impostor = other.leaf("impostor", &["envoy.client.example"]);
    let config = config_dir();
    let server = start(|c| {
        c.arg("--config")
            .arg(config.path())
            .env("GRPC_SERVER_USE_TLS", "true")
            .env("GRPC_SERVER_TLS_CERT", &leaf.cert)
            .env("GRPC_SERVER_TLS_KEY", &leaf.key)
            .env("GRPC_CLIENT_TLS_CACERT", &pki.ca)
            .env("GRPC_CLIENT_TLS_SAN", "envoy.client.example");
    });
    let rt = runtime();
    let as_client = |identity| Client {
        ca: &pki.ca,
        name: "localhost",
        identity,
    };
    assert_eq!(
        rt.block_on(call(server.grpc, &as_client(Some(&envoy)))),
        Ok(2)
    );
    for (who, identity) in [
        ("no certificate", None),
        ("a certificate from another CA", Some(&impostor)),
        ("a certificate without the SAN", Some(&stranger)),
    ] {
        let r = rt.block_on(call(server.grpc, &as_client(identity)));
        assert!(r.is_err(), "{who} was served: {r:?}");
    }
    assert_eq!(
        rt.block_on(call(server.grpc, &as_client(Some(&envoy)))),
        Ok(2)
    );
}

#[test]
fn grpc_mtls_without_a_san_takes_any_certificate_from_the_ca() {
    let pki = pki::TestPki::new();
    let leaf = pki.leaf("server", &["localhost"]);
    let anyone = pki.leaf("anyone", &["anyone.example"]);
    let config = config_dir();
    let server = start(|c| {
        c.arg("--config")
            .arg(config.path())
            .env("GRPC_SERVER_USE_TLS", "true")
            .env("GRPC_SERVER_TLS_CERT", &leaf.cert)
            .env("GRPC_SERVER_TLS_KEY", &leaf.key)
            .env("GRPC_CLIENT_TLS_CACERT", &pki.ca);
    });
    let rt = runtime();
    let mut client = Client {
        ca: &pki.ca,
        name: "localhost",
        identity: Some(&anyone),
    };
    assert_eq!(rt.block_on(call(server.grpc, &client)), Ok(2));
    client.identity = None;
    assert!(rt.block_on(call(server.grpc, &client)).is_err());
}

#[test]
fn grpc_certificate_is_reloaded_on_a_secret_swap_without_dropping_connections() {
    let first_ca = pki::TestPki::new();
    let second_ca = pki::TestPki::new();
    let first = first_ca.leaf("first", &["localhost"]);
    let second = second_ca.leaf("second", &["localhost"]);
    let secret = tempfile::tempdir().unwrap();
    pki::secret_version(secret.path(), 1, &first.cert, &first.key);
    let log_path = secret.path().join("sluice.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let config = config_dir();
    let server = start(|c| {
        c.arg("--config")
            .arg(config.path())
            .env("LOG_LEVEL", "info")
            .env("GRPC_SERVER_USE_TLS", "true")
            .env("GRPC_SERVER_TLS_CERT", secret.path().join("tls.crt"))
            .env("GRPC_SERVER_TLS_KEY", secret.path().join("tls.key"))
            .stderr(log);
    });
    let rt = runtime();
    let trusts = |ca| Client {
        ca,
        name: "localhost",
        identity: None,
    };
    let old = rt
        .block_on(grpc_tls::connect(server.grpc, &trusts(&first_ca.ca)))
        .expect("connect with the first certificate");
    assert_eq!(rt.block_on(grpc_tls::limit(old.clone())), Ok(2));
    assert!(
        rt.block_on(call(server.grpc, &trusts(&second_ca.ca)))
            .is_err()
    );

    // The secret rotates to a certificate from another CA.
    pki::secret_version(secret.path(), 2, &second.cert, &second.key);
    let started = Instant::now();
    wait_for(
        "a new connection to get the new certificate",
        Duration::from_secs(10),
        || {
            rt.block_on(call(server.grpc, &trusts(&second_ca.ca)))
                .is_ok()
        },
    );
    eprintln!("new certificate served after {:?}", started.elapsed());
    assert!(
        rt.block_on(call(server.grpc, &trusts(&first_ca.ca)))
            .is_err()
    );
    // The connection made before the swap is still up (tonic would have to reconnect to the
    // first CA's certificate otherwise, which is gone).
    assert_eq!(rt.block_on(grpc_tls::limit(old.clone())), Ok(2));

    // A broken rotation (new certificate, wrong key) is refused; the second one keeps serving.
    let third = first_ca.leaf("third", &["localhost"]);
    pki::secret_version(secret.path(), 3, &third.cert, &second.key);
    wait_for(
        "the rejection to be logged",
        Duration::from_secs(10),
        || {
            std::fs::read_to_string(&log_path).is_ok_and(|l| {
                l.contains("gRPC TLS certificate not reloaded")
                    && l.contains("GRPC_SERVER_TLS_KEY=")
                    && l.contains("does not match the certificate")
            })
        },
    );
    assert_eq!(
        rt.block_on(call(server.grpc, &trusts(&second_ca.ca))),
        Ok(2)
    );
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert_eq!(
        log.matches("gRPC TLS certificate not reloaded").count(),
        1,
        "logged once, not on every poll:\n{log}"
    );
    assert!(log.contains("gRPC TLS certificate reloaded"), "{log}");
    assert_eq!(rt.block_on(grpc_tls::limit(old)), Ok(2));
}

#[test]
fn bad_tls_files_stop_start_up_naming_the_variable() {
    let pki = pki::TestPki::new();
    let leaf = pki.leaf("server", &["localhost"]);
    let other = pki.leaf("other", &["localhost"]);
    let config = config_dir();
    let port = free_port();
    let refused_with = |vars: &[(&str, &Path)], expected: &str| {
        let mut c = sluice();
        c.arg("--config")
            .arg(config.path())
            .env("GRPC_HOST", "127.0.0.1")
            .env("GRPC_PORT", port.to_string())
            .env("GRPC_SERVER_USE_TLS", "true");
        for (var, value) in vars {
            c.env(var, value);
        }
        let out = run(c);
        assert_eq!(out.status.code(), Some(64), "{vars:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expected), "{expected} not in: {err}");
    };
    let missing = pki.dir().join("missing.pem");
    refused_with(
        &[
            ("GRPC_SERVER_TLS_CERT", &missing),
            ("GRPC_SERVER_TLS_KEY", &leaf.key),
        ],
        &format!("GRPC_SERVER_TLS_CERT={}: cannot read", missing.display()),
    );
    refused_with(
        &[
            ("GRPC_SERVER_TLS_CERT", &leaf.cert),
            ("GRPC_SERVER_TLS_KEY", &other.key),
        ],
        &format!(
            "GRPC_SERVER_TLS_KEY={}: the private key does not match",
            other.key.display()
        ),
    );
    refused_with(
        &[
            ("GRPC_SERVER_TLS_CERT", &leaf.key),
            ("GRPC_SERVER_TLS_KEY", &leaf.key),
        ],
        "GRPC_SERVER_TLS_CERT=",
    );
    refused_with(
        &[
            ("GRPC_SERVER_TLS_CERT", &leaf.cert),
            ("GRPC_SERVER_TLS_KEY", &leaf.key),
            ("GRPC_CLIENT_TLS_CACERT", &leaf.key),
        ],
        "GRPC_CLIENT_TLS_CACERT=",
    );
    // Nothing was bound: the port is still free.
    assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
}

// ---------------------------------------------------------------------------------------------
// Envoy Gateway's rate-limit Deployment.

mod ads {
    use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
        AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
    };
    use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
    };
    use envoy_types::pb::google::protobuf::Any;
    use envoy_types::pb::ratelimit::config::ratelimit::v3::{
        RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
    };
    use prost::Message;
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
    use tonic::transport::ServerTlsConfig;
    use tonic::{Request, Response, Status, Streaming};

    const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

    /// Answers every stream with one snapshot: domain `d`, key `k` at 7 a minute.
    struct OneSnapshot;

    #[tonic::async_trait]
    impl AggregatedDiscoveryService for OneSnapshot {
        type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
        type DeltaAggregatedResourcesStream =
            ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

        async fn stream_aggregated_resources(
            &self,
            request: Request<Streaming<DiscoveryRequest>>,
        ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
            let config = RateLimitConfig {
                name: "d-rl".into(),
                domain: "d".into(),
                descriptors: vec![RateLimitDescriptor {
                    key: "k".into(),
                    rate_limit: Some(RateLimitPolicy {
                        unit: RateLimitUnit::Minute as i32,
                        requests_per_unit: 7,
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
            };
            let (tx, rx) = mpsc::channel(4);
            let _ = tx
                .send(Ok(DiscoveryResponse {
                    version_info: "v1".into(),
                    nonce: "n1".into(),
                    type_url: TYPE_URL.into(),
                    resources: vec![Any {
                        type_url: TYPE_URL.into(),
                        value: config.encode_to_vec(),
                    }],
                    ..Default::default()
                }))
                .await;
            // Read the ACKs; the stream stays open while Sluice keeps it.
            let mut incoming = request.into_inner();
            tokio::spawn(async move {
                while let Ok(Some(_)) = incoming.message().await {}
                drop(tx);
            });
            Ok(Response::new(ReceiverStream::new(rx)))
        }

        async fn delta_aggregated_resources(
            &self,
            _request: Request<Streaming<DeltaDiscoveryRequest>>,
        ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
            Err(Status::unimplemented("state of the world only"))
        }
    }

    /// Serves on `listener` over `tls` until the runtime stops.
    pub fn spawn(listener: tokio::net::TcpListener, tls: ServerTlsConfig) {
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .tls_config(tls)
                .expect("ADS TLS")
                .add_service(AggregatedDiscoveryServiceServer::new(OneSnapshot))
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await;
        });
    }
}

/// The environment Envoy Gateway gives its rate-limit Deployment
/// (internal/infrastructure/kubernetes/ratelimit/resource.go, `expectedRateLimitContainerEnv`),
/// with the `/certs` secret mount, the xDS server's address and the ports made local.
/// GRPC_SERVER_TLS_CA_CERT is Envoy Gateway's name, which neither the Go service nor Sluice
/// reads, so clients are not asked for a certificate.
#[test]
fn envoy_gateway_environment_starts_and_serves_over_tls() {
    use tonic::transport::{Certificate, Identity, ServerTlsConfig};

    let pki = pki::TestPki::new();
    let certs = pki.dir().join("certs");
    std::fs::create_dir(&certs).unwrap();
    let ratelimit = pki.leaf("envoy-ratelimit", &["envoy-ratelimit", "127.0.0.1"]);
    std::fs::copy(&ratelimit.cert, certs.join("tls.crt")).unwrap();
    std::fs::copy(&ratelimit.key, certs.join("tls.key")).unwrap();
    std::fs::copy(&pki.ca, certs.join("ca.crt")).unwrap();
    let gateway = pki.leaf("envoy-gateway", &["envoy-gateway", "127.0.0.1"]);

    // The control plane: xDS over TLS, requiring a client certificate from the same CA.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let xds_port = listener.local_addr().unwrap().port();
    rt.block_on(async {
        ads::spawn(
            listener,
            ServerTlsConfig::new()
                .identity(Identity::from_pem(
                    std::fs::read(&gateway.cert).unwrap(),
                    std::fs::read(&gateway.key).unwrap(),
                ))
                .client_ca_root(Certificate::from_pem(std::fs::read(&pki.ca).unwrap())),
        )
    });

    let cert = |name: &str| certs.join(name);
    let server = start(|c| {
        c.env("RUNTIME_ROOT", "/data")
            .env("RUNTIME_SUBDIRECTORY", "ratelimit")
            .env("RUNTIME_IGNOREDOTFILES", "true")
            .env("RUNTIME_WATCH_ROOT", "false")
            .env("LOG_LEVEL", "info")
            .env("USE_STATSD", "false")
            .env("CONFIG_TYPE", "GRPC_XDS_SOTW")
            .env(
                "CONFIG_GRPC_XDS_SERVER_URL",
                format!("127.0.0.1:{xds_port}"),
            )
            .env("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit")
            .env("GRPC_SERVER_USE_TLS", "true")
            .env("GRPC_SERVER_TLS_CERT", cert("tls.crt"))
            .env("GRPC_SERVER_TLS_KEY", cert("tls.key"))
            .env("GRPC_SERVER_TLS_CA_CERT", cert("ca.crt"))
            .env("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true")
            .env("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert("tls.crt"))
            .env("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", cert("tls.key"))
            .env("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", cert("ca.crt"))
            .env("FORCE_START_WITHOUT_INITIAL_CONFIG", "true");
    });

    // Envoy's view: TLS to `envoy-ratelimit`, trusting the CA, no client certificate.
    let envoy = Client {
        ca: &pki.ca,
        name: "envoy-ratelimit",
        identity: None,
    };
    wait_for(
        "the xDS snapshot to be served over TLS",
        Duration::from_secs(15),
        || rt.block_on(call(server.grpc, &envoy)) == Ok(7),
    );
    assert!(rt.block_on(grpc_tls::plain_text_call(server.grpc)).is_err());
    let (status, body) = http(server.debug, "GET", "/rlconfig", "").expect("/rlconfig");
    assert_eq!(status, 200);
    assert!(
        body.contains("d.k: unit=MINUTE requests_per_unit=7"),
        "{body}"
    );
}

#[test]
fn bad_tracing_settings_stop_start_up() {
    refused("TRACING_SAMPLING_RATE", "2", "TRACING_SAMPLING_RATE=2");
    refused(
        "TRACING_EXPORTER_PROTOCOL",
        "udp",
        "TRACING_EXPORTER_PROTOCOL=udp",
    );
    refused(
        "OTEL_EXPORTER_OTLP_HEADERS",
        "justakey",
        "OTEL_EXPORTER_OTLP_HEADERS=justakey",
    );
    // An https collector's CA file is read before any port is bound.
    let mut c = sluice();
    c.env("TRACING_ENABLED", "true")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318")
        .env("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/otlp-ca.pem");
    let out = run(c);
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "OTEL_EXPORTER_OTLP_CERTIFICATE=/nonexistent/otlp-ca.pem: cannot read the file"
        ),
        "{err}"
    );
}

/// A minimal OTLP/HTTP collector: every POST body (keep-alive connections included) is
/// decoded as an ExportTraceServiceRequest and collected.
/// Each POST the collector received: its path and body.
type Received = std::sync::Arc<std::sync::Mutex<Vec<(String, Vec<u8>)>>>;

fn otlp_http_collector() -> (u16, Received) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = got.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let sink = sink.clone();
            std::thread::spawn(move || {
                let mut w = stream.try_clone().unwrap();
                let mut r = BufReader::new(stream);
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
                    let mut len = 0;
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 {
                            return;
                        }
                        if h == "\r\n" {
                            break;
                        }
                        if let Some((k, v)) = h.split_once(':')
                            && k.eq_ignore_ascii_case("content-length")
                        {
                            len = v.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0; len];
                    if r.read_exact(&mut body).is_err() {
                        return;
                    }
                    sink.lock().unwrap().push((path, body));
                    let _ = w.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
                }
            });
        }
    });
    (port, got)
}

#[test]
fn tracing_enabled_exports_the_callers_trace_to_an_otlp_collector() {
    use prost::Message;
    use sluice::telemetry::otlp::proto::{ExportTraceServiceRequest, any_value};
    use std::io::{Read, Write};
    let (collector, got) = otlp_http_collector();
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("config/d.yaml"), GOOD);
    let server = start(|c| {
        c.env("SLUICE_CONFIG", dir.path().join("config"))
            .env("TRACING_ENABLED", "true")
            .env("TRACING_SERVICE_NAME", "edge-ratelimit")
            .env(
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("http://127.0.0.1:{collector}"),
            )
            .env("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=acme")
            .env("OTEL_BSP_SCHEDULE_DELAY", "100");
    });
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", server.http)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "POST /json HTTP/1.1\r\nHost: x\r\nConnection: close\r\ntraceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    wait_for("a span at the collector", Duration::from_secs(10), || {
        !got.lock().unwrap().is_empty()
    });
    let (path, bytes) = got.lock().unwrap()[0].clone();
    assert_eq!(path, "/v1/traces");
    let request = ExportTraceServiceRequest::decode(bytes.as_slice()).unwrap();
    let rs = &request.resource_spans[0];
    let name = rs
        .resource
        .as_ref()
        .unwrap()
        .attributes
        .iter()
        .find(|kv| kv.key == "service.name")
        .and_then(|kv| kv.value.clone()?.value);
    assert_eq!(
        name,
        Some(any_value::Value::StringValue("edge-ratelimit".into()))
    );
    let span = &rs.scope_spans[0].spans[0];
    assert_eq!(span.name, "ShouldRateLimit Execution");
    let hex: String = span.trace_id.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(
        span.parent_span_id,
        [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
    );
}

/// With REDIS_STARTUP_MAX_ELAPSED_TIME, a Redis that never answers stops Sluice (exit 1,
/// naming the variable) within the bound rather than retrying for ever, as the Go service
/// gives up.
#[test]
fn redis_startup_gives_up_after_max_elapsed_time() {
    let config = config_dir();
    // Nothing listens on a fresh free port.
    let redis_port = free_port();
    let mut c = sluice();
    c.arg("--config")
        .arg(config.path())
        .env("HOST", "127.0.0.1")
        .env("GRPC_HOST", "127.0.0.1")
        .env("DEBUG_HOST", "127.0.0.1")
        .env("PORT", free_port().to_string())
        .env("GRPC_PORT", free_port().to_string())
        .env("DEBUG_PORT", free_port().to_string())
        .env("BACKEND_TYPE", "redis")
        .env("REDIS_SOCKET_TYPE", "tcp")
        .env("REDIS_URL", format!("127.0.0.1:{redis_port}"))
        .env("REDIS_TIMEOUT", "200ms")
        .env("REDIS_STARTUP_INITIAL_INTERVAL", "100ms")
        .env("REDIS_STARTUP_MAX_INTERVAL", "200ms")
        .env("REDIS_STARTUP_MAX_ELAPSED_TIME", "1s")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = c.spawn().expect("spawn sluice");
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(15) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("sluice still running 15 s after REDIS_STARTUP_MAX_ELAPSED_TIME=1s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("REDIS_STARTUP_MAX_ELAPSED_TIME") && err.contains(&redis_port.to_string()),
        "{err}"
    );
    // Not before the bound: it did retry for about a second.
    assert!(started.elapsed() >= Duration::from_millis(700), "{err}");
}

/// GRPC_MAX_CONNECTION_AGE: an HTTP/2 connection older than the age gets a GOAWAY and, once
/// idle, is closed. Spoken in raw frames so nothing reconnects behind the test's back.
#[test]
fn grpc_connections_get_a_goaway_after_max_connection_age() {
    use std::io::{Read, Write};
    let config = config_dir();
    let server = start(|c| {
        c.arg("--config")
            .arg(config.path())
            .env("GRPC_MAX_CONNECTION_AGE", "1s")
            .env("GRPC_MAX_CONNECTION_AGE_GRACE", "1s");
    });
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", server.grpc)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let opened = Instant::now();
    // The client preface, then an empty SETTINGS frame.
    conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    conn.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).unwrap();
    let mut goaway_at = None;
    loop {
        let mut header = [0u8; 9];
        match conn.read_exact(&mut header) {
            Ok(()) => {}
            // Closed by the server.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("no GOAWAY and no close within 10 s: {e}"),
        }
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0u8; len];
        conn.read_exact(&mut payload).unwrap();
        if header[3] == 7 && goaway_at.is_none() {
            goaway_at = Some(opened.elapsed());
        }
        // Answer the PING of hyper's graceful shutdown, as a client must.
        if header[3] == 6 && header[4] & 1 == 0 {
            conn.write_all(&[0, 0, 8, 6, 1, 0, 0, 0, 0]).unwrap();
            conn.write_all(&payload).unwrap();
        }
        // Acknowledge the server's SETTINGS, as a client must.
        if header[3] == 4 && header[4] & 1 == 0 {
            conn.write_all(&[0, 0, 0, 4, 1, 0, 0, 0, 0]).unwrap();
        }
    }
    let goaway_at = goaway_at.expect("a GOAWAY before the close");
    assert!(
        goaway_at >= Duration::from_millis(900) && goaway_at < Duration::from_secs(5),
        "GOAWAY after {goaway_at:?}"
    );
    // The server still takes new connections.
    assert_eq!(json(server.http, "d", "k", "v").0, 200);
}

/// A process's resident memory, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

/// A process's CPU time so far (user + system), in clock ticks (1/100 s on Linux).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// What a flooding HTTP/2 connection saw.
#[derive(Debug, Default)]
struct Flood {
    streams_opened: u32,
    refused: u32,
    goaway: bool,
}

/// Opens gRPC streams on one connection as fast as it can for `duration`, each sending its
/// headers and never its message, ignoring the server's stream limit as an attacker would.
fn flood_streams(port: u16, duration: Duration) -> Flood {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    conn.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).unwrap();
    // The reader counts refusals and answers what a client must answer.
    let mut reader = conn.try_clone().unwrap();
    let mut acks = conn.try_clone().unwrap();
    let seen = std::thread::spawn(move || {
        let mut flood = Flood::default();
        let mut header = [0u8; 9];
        while reader.read_exact(&mut header).is_ok() {
            let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
            let mut payload = vec![0u8; len];
            if reader.read_exact(&mut payload).is_err() {
                break;
            }
            match (header[3], header[4] & 1) {
                (3, _) if payload == [0, 0, 0, 7] => flood.refused += 1,
                (7, _) => flood.goaway = true,
                (4, 0) => {
                    let _ = acks.write_all(&[0, 0, 0, 4, 1, 0, 0, 0, 0]);
                }
                _ => {}
            }
        }
        flood
    });
    let mut block = Vec::new();
    for (name, value) in [
        (":method", "POST"),
        (":scheme", "http"),
        (
            ":path",
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        ),
        (":authority", "sluice"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        // HPACK literals without indexing, so every frame stands alone.
        block.extend([0, name.len() as u8]);
        block.extend(name.as_bytes());
        block.push(value.len() as u8);
        block.extend(value.as_bytes());
    }
    let started = Instant::now();
    let mut stream_id = 1u32;
    let mut opened = 0;
    'flood: while started.elapsed() < duration {
        let mut batch = Vec::new();
        for _ in 0..100 {
            let len = (block.len() as u32).to_be_bytes();
            // HEADERS with END_HEADERS and without END_STREAM.
            batch.extend([len[1], len[2], len[3], 1, 4]);
            batch.extend(stream_id.to_be_bytes());
            batch.extend(&block);
            stream_id += 2;
        }
        if conn.write_all(&batch).is_err() {
            break 'flood;
        }
        opened += 100;
    }
    let _ = conn.shutdown(std::net::Shutdown::Both);
    let mut flood = seen.join().unwrap();
    flood.streams_opened = opened;
    flood
}

/// The issue's finding: one connection opened 274,400 streams in 5 s and the process grew to
/// 2.1 GB, with other clients' calls taking up to 852 ms. With SLUICE_MAX_CONCURRENT_STREAMS,
/// streams past the cap are refused, memory stays flat, and others are served promptly.
#[test]
fn a_stream_flood_on_one_connection_keeps_memory_flat_and_others_served() {
    let config = config_dir();
    let server = start(|c| {
        c.arg("--config").arg(config.path());
    });
    let pid = server.child.id();
    let rt = runtime();
    assert_eq!(rt.block_on(grpc_tls::plain_text_call(server.grpc)), Ok(2));
    let before = rss_kib(pid);
    let port = server.grpc;
    let flood = std::thread::spawn(move || flood_streams(port, Duration::from_secs(5)));
    let mut slowest = Duration::ZERO;
    let mut calls = 0;
    while !flood.is_finished() {
        let call = Instant::now();
        assert_eq!(rt.block_on(grpc_tls::plain_text_call(server.grpc)), Ok(2));
        slowest = slowest.max(call.elapsed());
        calls += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    let flood = flood.join().unwrap();
    let after = rss_kib(pid);
    eprintln!(
        "flood: {flood:?}; RSS {before} -> {after} KiB; slowest of {calls} calls {slowest:?}"
    );
    assert!(flood.streams_opened >= 1000, "{flood:?}");
    // Past the first 100, every stream is refused, or the server gives up on the connection.
    assert!(
        flood.goaway || flood.refused + 100 >= flood.streams_opened,
        "{flood:?}"
    );
    assert!(
        after < before + 64 * 1024,
        "RSS grew from {before} KiB to {after} KiB under {flood:?}"
    );
    assert!(
        calls > 0 && slowest < Duration::from_secs(1),
        "slowest of {calls} calls during the flood: {slowest:?}"
    );
}

/// The issue's finding: with every descriptor taken by idle connections, the gRPC accept loop
/// retried at once (7,000 failed accepts a second, a core busy). Now every listener pauses,
/// and serves again once descriptors are free.
#[test]
fn out_of_descriptors_every_accept_loop_waits_instead_of_spinning() {
    let config = config_dir();
    let mut shell = Command::new("sh");
    shell.args(["-c", "ulimit -n 64 && exec \"$0\" \"$@\"", BIN]);
    for v in SCRUBBED {
        shell.env_remove(v);
    }
    let server = start_command(shell, |c| {
        c.arg("--config").arg(config.path());
    });
    let pid = server.child.id();
    // Idle connections until the process has no descriptor left, then some waiting on every
    // listener's backlog, each making its accept fail.
    let mut held = Vec::new();
    for port in std::iter::repeat_n(server.http, 70)
        .chain(std::iter::repeat_n(server.grpc, 10))
        .chain(std::iter::repeat_n(server.debug, 10))
    {
        held.push(std::net::TcpStream::connect(("127.0.0.1", port)).unwrap());
    }
    std::thread::sleep(Duration::from_millis(500));
    let (ticks, started) = (cpu_ticks(pid), Instant::now());
    std::thread::sleep(Duration::from_secs(3));
    let used = cpu_ticks(pid) - ticks;
    let wall = started.elapsed().as_secs_f64() * 100.0;
    eprintln!("out of descriptors: {used} CPU ticks in {wall:.0}");
    assert!(
        (used as f64) < wall * 0.3,
        "{used} ticks of CPU in {wall:.0} while out of descriptors: a busy accept loop"
    );
    drop(held);
    wait_for(
        "the HTTP port to serve again",
        Duration::from_secs(15),
        || http(server.http, "GET", "/healthcheck", "").is_some_and(|(s, _)| s == 200),
    );
    assert_eq!(
        runtime().block_on(grpc_tls::plain_text_call(server.grpc)),
        Ok(2)
    );
}

/// GRPC_UDS: gRPC on a unix socket, replacing a stale socket file left by a process that is
/// gone, and removing it on a clean exit; a live socket and a regular file are left alone.
/// A sluice command with gRPC on the unix socket `socket` and its other ports free.
fn uds_instance(config: &Path, socket: &Path) -> Command {
    let mut c = sluice();
    c.arg("--config")
        .arg(config)
        .env("HOST", "127.0.0.1")
        .env("PORT", free_port().to_string())
        .env("DEBUG_HOST", "127.0.0.1")
        .env("DEBUG_PORT", free_port().to_string())
        .env("GRPC_UDS", socket);
    c
}

#[test]
fn grpc_uds_serves_on_a_unix_socket_and_replaces_a_stale_one() {
    use std::future::Future;
    use std::path::PathBuf;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// Dials the socket whatever URI tonic asks for.
    #[derive(Clone)]
    struct Uds(PathBuf);
    impl tonic::codegen::Service<tonic::transport::Uri> for Uds {
        type Response = hyper_util::rt::TokioIo<tokio::net::UnixStream>;
        type Error = std::io::Error;
        type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: tonic::transport::Uri) -> Self::Future {
            let path = self.0.clone();
            Box::pin(async move {
                Ok(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            })
        }
    }

    let config = config_dir();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ratelimit.sock");
    // A stale socket: bound, then its listener gone.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());

    let server = start(|c| {
        c.arg("--config")
            .arg(config.path())
            .env("GRPC_UDS", &socket);
    });
    let rt = runtime();
    let limit = rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_static("http://uds.invalid")
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(5))
            .connect_with_connector(Uds(socket.clone()))
            .await
            .expect("connect over the unix socket");
        grpc_tls::limit(channel).await
    });
    assert_eq!(limit, Ok(2));
    // Closes the client's connection, which would otherwise hold the drain up.
    drop(rt);
    // Instead of TCP, as in Go: nothing listens on GRPC_PORT.
    assert!(std::net::TcpStream::connect(("127.0.0.1", server.grpc)).is_err());

    // A second instance must not steal the live socket.
    let out = run(uds_instance(config.path(), &socket));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("GRPC_UDS=") && err.contains("another process"),
        "{err}"
    );

    // A regular file is not replaced.
    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, "data").unwrap();
    let out = run(uds_instance(config.path(), &file));
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "data");

    // SIGTERM: a clean exit removes the socket file.
    let mut server = server;
    let pid = server.child.id().to_string();
    signal(&pid, "TERM");
    let started = Instant::now();
    while server.child.try_wait().unwrap().is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!socket.exists(), "the socket file outlived the process");
}

/// `sluice explain` as an operator runs it: against a config file (the walk, the limit, the
/// keys), against a running Sluice's debug port (the counters and the answer), as text or
/// JSON; and refusing what it cannot explain.
#[test]
fn explain_answers_why_a_request_is_limited() {
    let fixture = explain_fixture();
    let config = fixture.to_str().unwrap();
    let (code, text, err) = explain(&[
        "--config",
        config,
        "--domain",
        "ex",
        "--descriptor",
        "tenant=acme&route=x",
        "--descriptor",
        "trusted=t",
        "--descriptor",
        "ip=10.0.0.9",
    ]);
    assert_eq!(code, Some(0), "{err}");
    for line in [
        "descriptor 0: tenant=acme, route=x",
        "  level 1: tenant=acme matched `tenant_acme` (exact)",
        "  level 2: route=x matched `route` (key only), limit ex.tenant_acme.route",
        "    2 per HOUR (token_bucket)",
        "  counter ex_tenant_acme_route_x_",
        "  limit ex.trusted: unlimited (always OK, never counted), replaces [\"per_ip\"]",
        "  replaced by [\"ex.trusted\"] (`replaces`): answers OK, uncounted",
    ] {
        assert!(text.contains(line), "{line:?} not in:\n{text}");
    }
}

/// `tests/fixtures/explain`, which `tests/explain.rs` uses too.
fn explain_fixture() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/explain")
}

/// `sluice explain ARGS`: its exit code, standard output and standard error.
fn explain(args: &[&str]) -> (Option<i32>, String, String) {
    let mut c = sluice();
    c.arg("explain").args(args);
    let out = run(c);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code(), text, err)
}

/// Against a running Sluice: the counter's state and the answer it would give; and what it
/// cannot explain.
#[test]
fn explain_reads_a_running_sluices_counters() {
    let fixture = explain_fixture();
    let server = start(|c| {
        c.arg("--config").arg(&fixture);
    });
    for _ in 0..2 {
        let body = r#"{"domain":"ex","descriptors":[{"entries":[{"key":"user","value":"bob"}]}]}"#;
        assert_eq!(http(server.http, "POST", "/json", body).unwrap().0, 200);
    }
    let addr = format!("127.0.0.1:{}", server.debug);
    let (code, text, err) = explain(&[
        "--debug-address",
        &addr,
        "--domain",
        "ex",
        "--descriptor",
        "user=bob",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        text.contains("  counter ex_user_bob_: count 2, remaining 0"),
        "{text}"
    );
    assert!(text.contains("1 more hit(s) would be refused"), "{text}");
    assert!(text.contains("overall: OVER_LIMIT"), "{text}");
    let (_, json, _) = explain(&[
        "--debug-address",
        &addr,
        "--domain",
        "ex",
        "--descriptor",
        "user=bob",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(v["descriptors"][0]["counters"][0]["count"], 2);

    // What it cannot explain: exit 1 with the reason; bad flags: 64.
    let (code, _, err) = explain(&[
        "--config",
        "/nonexistent",
        "--domain",
        "ex",
        "--descriptor",
        "a=b",
    ]);
    assert_eq!(code, Some(1));
    assert!(err.contains("sluice explain: "), "{err}");
    let (code, _, err) = explain(&[
        "--debug-address",
        "127.0.0.1:1",
        "--domain",
        "ex",
        "--descriptor",
        "a=b",
    ]);
    assert_eq!(code, Some(1));
    assert!(err.contains("cannot connect to 127.0.0.1:1"), "{err}");
    let (code, _, _) = explain(&["--domain", "ex", "--descriptor", "a=b"]);
    assert_eq!(code, Some(64), "neither --config nor --debug-address");

    // The /json form from a file, against the running Sluice: a request override.
    let dir = tempfile::tempdir().unwrap();
    let request = dir.path().join("request.json");
    std::fs::write(
        &request,
        r#"{"domain":"ex","descriptors":[{"entries":[{"key":"user","value":"bob"}],"limit":{"requestsPerUnit":9,"unit":"HOUR"}}]}"#,
    )
    .unwrap();
    let (code, text, err) = explain(&[
        "--debug-address",
        &addr,
        "--request",
        request.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(text.contains("request override: 9 per HOUR"), "{text}");
}

/// `sluice probe`, the Helm chart's test hook: passes against a serving Sluice, fails naming
/// what did not answer.
#[test]
fn probe_checks_that_a_release_answers() {
    let dir = config_dir();
    let server = start(|c| {
        c.arg("--config").arg(dir.path());
    });
    let mut c = sluice();
    c.args(["probe", "--address", &format!("127.0.0.1:{}", server.http)]);
    let out = run(c);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        text.contains("/healthcheck 200, /json 200 with overallCode OK"),
        "{text}"
    );
    drop(server);
    let port = free_port();
    let mut c = sluice();
    c.args(["probe", "--address", &format!("127.0.0.1:{port}")]);
    let out = run(c);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("sluice probe: cannot connect to 127.0.0.1:{port}")),
        "{err}"
    );
}
