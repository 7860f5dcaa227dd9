//! nginx (Debian's package) in front of Sluice, running `examples/nginx/` as it is: the
//! `auth_request` subrequest to `/nginx`, 429 with the forwarded headers, and 500 (fail
//! closed, as documented) once Sluice is gone.
//!
//! nginx is found through SLUICE_NGINX, else PATH or /usr/sbin/nginx. Missing, the test fails
//! under the test command and CI, and is a recorded skip elsewhere (`support::missing`).

mod proxies;
mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use proxies::{Proc, Sluice, Upstream, fill, free_port, get, repo, try_get, wait_for};

#[test]
fn nginx_example_limits_by_address_and_api_key_and_fails_closed() {
    let Some(nginx) = proxies::locate(
        "SLUICE_NGINX",
        &[PathBuf::from("/usr/sbin/nginx")],
        "nginx",
        "apt-get install nginx",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Run as root, nginx's workers are `nobody`: let them reach their temp directories.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let example = repo().join("examples/nginx");
    let mut sluice = Sluice::start(&example.join("sluice.yaml"), dir.path());
    let upstream = Upstream::start();
    let port = free_port();
    let template = std::fs::read_to_string(example.join("nginx.conf")).unwrap();
    let conf = fill(
        &template,
        &[
            ("LISTEN_PORT", port.to_string()),
            ("RATELIMIT_HOST", "127.0.0.1".into()),
            ("RATELIMIT_HTTP_PORT", sluice.http.to_string()),
            ("UPSTREAM_HOST", "127.0.0.1".into()),
            ("UPSTREAM_PORT", upstream.port.to_string()),
        ],
    );
    let conf_path = dir.path().join("nginx.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let pid = dir.path().join("nginx.pid");

    // -e: nginx opens its compiled-in error log before reading the config; keep it in DIR.
    let nginx_cmd = |globals: &str| {
        let mut c = Command::new(&nginx);
        c.arg("-p")
            .arg(dir.path())
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
    let mut proc = Proc::spawn(
        "nginx",
        nginx_cmd("daemon off; "),
        dir.path().join("nginx.log"),
    )
    .with_graceful_stop(stop);
    wait_for("nginx to listen", Duration::from_secs(10), || {
        proc.assert_running();
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });

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
