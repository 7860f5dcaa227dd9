//! HAProxy (Debian's package) in front of Sluice's SPOE agent, running `examples/haproxy/` as
//! it is: the `sluice-check` message on every request, 429 with `Retry-After` and
//! `RateLimit-*` over the limit, the headers on allowed answers too, and 503 (fail closed, as
//! documented) once Sluice is gone.
//!
//! HAProxy is found through SLUICE_HAPROXY, else PATH or /usr/sbin/haproxy. Missing, the test
//! fails under the test command and CI, and is a recorded skip elsewhere (`support::missing`).

mod proxies;
mod support;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use proxies::{
    Proc, Sluice, Upstream, fill, free_port, get, repo, try_get, try_get_from, wait_for,
};

#[test]
fn haproxy_example_limits_by_address_and_api_key_and_fails_closed() {
    let Some(haproxy) = proxies::locate(
        "SLUICE_HAPROXY",
        &[PathBuf::from("/usr/sbin/haproxy")],
        "haproxy",
        "apt-get install haproxy",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let example = repo().join("examples/haproxy");
    let spoa_port = free_port();
    let mut sluice = Sluice::start_with_env(
        &example.join("sluice.yaml"),
        dir.path(),
        &[
            ("SPOA_HOST", &OsString::from("127.0.0.1")),
            ("SPOA_PORT", &OsString::from(spoa_port.to_string())),
        ],
    );
    let upstream = Upstream::start();
    let port = free_port();
    let spoe = dir.path().join("spoe.conf");
    std::fs::copy(example.join("spoe.conf"), &spoe).unwrap();
    let template = std::fs::read_to_string(example.join("haproxy.cfg")).unwrap();
    let conf = fill(
        &template,
        &[
            ("LISTEN_HOST", "127.0.0.1".into()),
            ("LISTEN_PORT", port.to_string()),
            ("SPOE_CONFIG", spoe.display().to_string()),
            ("RATELIMIT_HOST", "127.0.0.1".into()),
            ("RATELIMIT_SPOA_PORT", spoa_port.to_string()),
            ("UPSTREAM_HOST", "127.0.0.1".into()),
            ("UPSTREAM_PORT", upstream.port.to_string()),
        ],
    );
    let conf_path = dir.path().join("haproxy.cfg");
    std::fs::write(&conf_path, conf).unwrap();
    let check = Command::new(&haproxy)
        .arg("-c")
        .arg("-f")
        .arg(&conf_path)
        .output()
        .expect("run haproxy -c");
    assert!(
        check.status.success(),
        "haproxy -c failed:\n{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let mut cmd = Command::new(&haproxy);
    cmd.arg("-db").arg("-f").arg(&conf_path);
    let mut proc = Proc::spawn("haproxy", cmd, dir.path().join("haproxy.log"));
    // Routing once HAProxy's agent connection answers (from an address the scenario leaves
    // alone).
    wait_for("HAProxy to route", Duration::from_secs(20), || {
        proc.assert_running();
        try_get_from([127, 0, 0, 9], port, "/", &[]).is_some_and(|a| a.status == 200)
    });

    proxies::limits_by_address_and_api_key(port, &upstream, &proxies::SLUICE_HEADERS);
    proxies::injected_headers_change_nothing(port);

    // Sluice gone: the SPOE call fails, txn.sluice.code stays unset, HAProxy answers 503 and
    // nothing reaches the app.
    sluice.proc.stop();
    let before = upstream.hits();
    let a = get(port, "/", &[("X-Api-Key", "key-d")]);
    assert_eq!(a.status, 503, "{a:#?}");
    assert_eq!(upstream.hits(), before);
    assert!(try_get(port, "/", &[]).is_some());
    proc.assert_running();
}
