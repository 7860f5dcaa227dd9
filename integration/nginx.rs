//! nginx (Debian's package) in front of Sluice, running `examples/nginx/` as it is: the
//! `auth_request` subrequest to `/nginx`, 429 with the forwarded headers, and 500 (fail
//! closed, as documented) once Sluice is gone; and `examples/nginx-inflight/`: requests in
//! flight counted by a refund `post_action` sends after each request.
//!
//! nginx is found through SLUICE_NGINX, else PATH or /usr/sbin/nginx. Missing, the test fails
//! under the test command and CI, and is a recorded skip elsewhere (`process::missing`).

mod proxies;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use sluice_test_support::http::http;

use proxies::{Proc, Sluice, Upstream, fill, free_port, get, repo, try_get, wait_for};

/// nginx running `examples/<example>/nginx.conf` (filled in) in front of `upstream`, asking
/// the Sluice on `sluice_http`, from `dir`; with the port it listens on. `None` (a recorded
/// skip) without nginx.
fn start_nginx(
    dir: &std::path::Path,
    example: &str,
    sluice_http: u16,
    upstream: &Upstream,
) -> Option<(Proc, u16)> {
    let nginx = proxies::locate(
        "SLUICE_NGINX",
        &[PathBuf::from("/usr/sbin/nginx")],
        "nginx",
        "apt-get install nginx",
    )?;
    // Run as root, nginx's workers are `nobody`: let them reach their temp directories.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let port = free_port();
    let template = std::fs::read_to_string(repo().join(example).join("nginx.conf")).unwrap();
    let conf = fill(
        &template,
        &[
            ("LISTEN_PORT", port.to_string()),
            ("RATELIMIT_HOST", "127.0.0.1".into()),
            ("RATELIMIT_HTTP_PORT", sluice_http.to_string()),
            ("UPSTREAM_HOST", "127.0.0.1".into()),
            ("UPSTREAM_PORT", upstream.port.to_string()),
        ],
    );
    let conf_path = dir.join("nginx.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let pid = dir.join("nginx.pid");

    // -e: nginx opens its compiled-in error log before reading the config; keep it in DIR.
    let nginx_cmd = |globals: &str| {
        let mut c = Command::new(&nginx);
        c.arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(&conf_path)
            .arg("-e")
            .arg("stderr")
            .arg("-g")
            .arg(format!("{globals}pid {};", pid.display()));
        c
    };
    let check = nginx_cmd("").arg("-t").output().expect("run nginx -t");
    assert!(
        check.status.success(),
        "nginx -t failed:\n{}",
        String::from_utf8_lossy(&check.stderr)
    );

    // Stopped through its master (`-s stop`), nginx leaves no worker behind.
    let mut stop = nginx_cmd("");
    stop.args(["-s", "stop"]);
    let mut proc = Proc::spawn("nginx", nginx_cmd("daemon off; "), dir.join("nginx.log"))
        .with_graceful_stop(stop);
    wait_for("nginx to listen", Duration::from_secs(10), || {
        proc.assert_running();
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    Some((proc, port))
}

#[test]
fn nginx_example_limits_by_address_and_api_key_and_fails_closed() {
    let dir = tempfile::tempdir().unwrap();
    let example = repo().join("examples/nginx");
    let mut sluice = Sluice::start(&example.join("sluice.yaml"), dir.path());
    let upstream = Upstream::start();
    let Some((mut proc, port)) = start_nginx(dir.path(), "examples/nginx", sluice.http, &upstream)
    else {
        return;
    };

    proxies::limits_by_address_and_api_key(port, &upstream, &proxies::SLUICE_HEADERS);

    // Sluice gone: the subrequest fails, auth_request answers 500, nothing reaches the app.
    sluice.proc.stop();
    let before = upstream.hits();
    let a = get(port, "/", &[("X-Api-Key", "key-d")]);
    assert_eq!(a.status, 500, "{a:#?}");
    assert_eq!(upstream.hits(), before);
    // nginx itself is still up.
    assert!(try_get(port, "/", &[]).is_some());
    proc.assert_running();

    proc.stop();
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "nginx still listening after stop"
    );
}

/// `examples/nginx-inflight`: 2 requests in flight per API key, a hit from `auth_request` and
/// a refund from `post_action` after each request, refused ones included.
#[test]
fn nginx_counts_requests_in_flight_with_post_action_refunds() {
    let dir = tempfile::tempdir().unwrap();
    let example = repo().join("examples/nginx-inflight");
    let sluice = Sluice::start(&example.join("sluice.yaml"), dir.path());
    let upstream = Upstream::start();
    let Some((mut proc, port)) = start_nginx(
        dir.path(),
        "examples/nginx-inflight",
        sluice.http,
        &upstream,
    ) else {
        return;
    };
    let refunds = || {
        let line = r#"ratelimit_service_rate_limit_total_negative_hits{domain="inflight",key1="inflight"} "#;
        http(sluice.debug, "GET", "/metrics", "")
            .and_then(|(_, body)| {
                body.lines()
                    .find_map(|l| l.strip_prefix(line))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            })
            .unwrap_or(0)
    };
    let refunds_reach = |n: u64| {
        wait_for(&format!("{n} refunds"), Duration::from_secs(10), || {
            refunds() >= n
        });
    };
    // One at a time: each request's refund frees its place, so five pass on a limit of 2.
    for n in 1..=5 {
        let a = get(port, "/", &[("X-Api-Key", "k1")]);
        assert_eq!(a.status, 200, "request {n}: {a:#?}");
        refunds_reach(n);
    }
    // Two held in flight elsewhere: the next is refused (429), and its refund cancels its
    // counted hit, so the one after is refused too.
    let held = |negative: bool| {
        let body = format!(
            r#"{{"domain":"inflight","descriptors":[{{"entries":[{{"key":"inflight","value":"k1"}}],"is_negative_hits":{negative}}}]}}"#
        );
        assert_eq!(
            http(sluice.http, "POST", "/json", &body).map(|(s, _)| s),
            Some(200)
        );
    };
    held(false);
    held(false);
    for n in 6..=7 {
        let a = get(port, "/", &[("X-Api-Key", "k1")]);
        assert_eq!(a.status, 429, "{a:#?}");
        refunds_reach(n);
    }
    // One of the held requests ends (the 8th refund): the next passes, and its refund is the
    // 9th. One still held.
    held(true);
    assert_eq!(get(port, "/", &[("X-Api-Key", "k1")]).status, 200);
    refunds_reach(9);
    // A client's own X-Sluice-Negative-Hits does not turn its check into a refund: with two
    // held, it is refused.
    held(false);
    let a = get(
        port,
        "/",
        &[("X-Api-Key", "k1"), ("X-Sluice-Negative-Hits", "true")],
    );
    assert_eq!(a.status, 429, "{a:#?}");
    assert_eq!(upstream.hits(), 6);
    proc.assert_running();
}
