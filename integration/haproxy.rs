//! HAProxy (Debian's package) in front of Sluice's SPOE agent, running `examples/haproxy/` as
//! it is: the `sluice-check` message on every request, 429 with `Retry-After` and
//! `RateLimit-*` over the limit, the headers on allowed answers too, and 503 (fail closed, as
//! documented) once Sluice is gone.
//!
//! And a limit of requests in flight: a second message on the response event refunds each
//! request's hit (`negative_hits`), as docs/haproxy.md's Refunds section says.
//!
//! HAProxy is found through SLUICE_HAPROXY, else PATH or /usr/sbin/haproxy. Missing, the test
//! fails under the test command and CI, and is a recorded skip elsewhere (`process::missing`).

mod proxies;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use sluice_test_support::http::http;

use proxies::{
    Proc, Sluice, Upstream, fill, free_port, get, repo, try_get, try_get_from, wait_for,
};

#[test]
fn haproxy_example_limits_by_address_and_api_key_and_fails_closed() {
    let Some(haproxy) = haproxy() else {
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

/// docs/haproxy.md's refunds: the check on the request, the same descriptor as a refund on the
/// response event (its value kept in a transaction variable, as the request's headers are gone
/// by then). A limit of 2 in flight per API key: five requests in turn all pass.
#[test]
fn haproxy_refunds_each_request_on_its_response() {
    let Some(haproxy) = haproxy() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (sluice, spoa_port) = in_flight_sluice(dir.path(), "{unit: hour, requests_per_unit: 2}");
    let upstream = Upstream::start();
    let (mut proc, port) = in_flight_haproxy(&haproxy, dir.path(), spoa_port, &upstream);
    let stat = |name: &str| {
        let line =
            format!(r#"ratelimit_service_rate_limit_{name}{{domain="inflight",key1="inflight"}} "#);
        http(sluice.debug, "GET", "/metrics", "")
            .and_then(|(_, body)| {
                body.lines()
                    .find_map(|l| l.strip_prefix(line.as_str()))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            })
            .unwrap_or(0)
    };
    // Routing once HAProxy's agent connection answers (a request without the header counts
    // nothing: its descriptor is left out).
    wait_for("HAProxy to route", Duration::from_secs(20), || {
        proc.assert_running();
        try_get(port, "/", &[]).is_some_and(|a| a.status == 200)
    });
    for n in 1..=5u64 {
        let a = get(port, "/", &[("X-Api-Key", "k1")]);
        assert_eq!(a.status, 200, "request {n}: {a:#?}");
        wait_for(&format!("{n} refunds"), Duration::from_secs(10), || {
            stat("total_negative_hits") >= n
        });
    }
    assert_eq!(stat("total_hits"), 5);
    // Two held in flight: the next is refused, and no refund comes for it (no response
    // event for what `http-request deny` answered).
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
    assert_eq!(get(port, "/", &[("X-Api-Key", "k1")]).status, 429);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(stat("total_negative_hits"), 5);
    proc.assert_running();
}

/// `algorithm: concurrency` with `charge_refused: false` behind HAProxy's two messages (the
/// start on the request, the refund on the response, for admitted requests only) and an
/// application that holds each request: 2 of 3 slow requests are held, the third is refused
/// and sends no refund; one finishing frees its slot for the next; never more than 2 at once.
#[test]
fn haproxy_holds_a_concurrency_limit_with_its_response_refunds() {
    let Some(haproxy) = haproxy() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (sluice, spoa_port) = in_flight_sluice(
        dir.path(),
        "{unit: minute, requests_per_unit: 2, algorithm: concurrency, charge_refused: false}",
    );
    let upstream = Upstream::start_gated();
    let (mut proc, port) = in_flight_haproxy(&haproxy, dir.path(), spoa_port, &upstream);
    upstream.release(1);
    wait_for("HAProxy to route", Duration::from_secs(20), || {
        proc.assert_running();
        try_get(port, "/", &[]).is_some_and(|a| a.status == 200)
    });
    let slow = || std::thread::spawn(move || get(port, "/", &[("X-Api-Key", "k1")]).status);
    let held = |n: usize| {
        wait_for(&format!("{n} held"), Duration::from_secs(20), || {
            upstream.in_flight().0 == n
        });
    };
    let mut running = vec![slow(), slow()];
    held(2);
    assert_eq!(get(port, "/", &[("X-Api-Key", "k1")]).status, 429);
    upstream.release(1);
    let first = running.remove(0);
    wait_for("one finished", Duration::from_secs(20), || {
        first.is_finished() || running[0].is_finished()
    });
    held(1);
    // Its refund, on the response, freed its slot (the refusal kept no debt to pay).
    wait_for("a slot free again", Duration::from_secs(20), || {
        let s = http(sluice.debug, "GET", "/metrics", "").map(|(_, b)| b);
        s.is_some_and(|b| b.contains("ratelimit_service_rate_limit_slots_given_back{domain=\"inflight\",key1=\"inflight\"} 1"))
    });
    running.push(first);
    running.push(slow());
    held(2);
    assert_eq!(get(port, "/", &[("X-Api-Key", "k1")]).status, 429);
    upstream.release(2);
    let statuses: Vec<u16> = running.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(statuses, [200, 200, 200]);
    assert_eq!(upstream.in_flight().1, 2, "never more than 2 in flight");
    proc.assert_running();
}

/// HAProxy: SLUICE_HAPROXY, `/usr/sbin/haproxy` or PATH.
fn haproxy() -> Option<PathBuf> {
    proxies::locate(
        "SLUICE_HAPROXY",
        &[PathBuf::from("/usr/sbin/haproxy")],
        "haproxy",
        "apt-get install haproxy",
    )
}

/// Sluice with one limit, `rate_limit` (a YAML flow mapping), on the descriptor `inflight` of
/// domain `inflight`, its SPOE agent on a free port; and that port.
fn in_flight_sluice(dir: &std::path::Path, rate_limit: &str) -> (Sluice, u16) {
    let limits = dir.join("sluice.yaml");
    std::fs::write(
        &limits,
        format!(
            "domain: inflight\ndescriptors:\n  - key: inflight\n    rate_limit: {rate_limit}\n"
        ),
    )
    .unwrap();
    let spoa_port = free_port();
    let sluice = Sluice::start_with_env(
        &limits,
        dir,
        &[
            ("SPOA_HOST", &OsString::from("127.0.0.1")),
            ("SPOA_PORT", &OsString::from(spoa_port.to_string())),
        ],
    );
    (sluice, spoa_port)
}

/// HAProxy from the example's haproxy.cfg with docs/haproxy.md's refunds: the API key kept in
/// `txn.api_key`, the check message on the request and the refund message on the response;
/// started from `dir`, with the port it listens on.
fn in_flight_haproxy(
    haproxy: &std::path::Path,
    dir: &std::path::Path,
    spoa_port: u16,
    upstream: &Upstream,
) -> (Proc, u16) {
    let port = free_port();
    let spoe = dir.join("spoe.conf");
    std::fs::write(
        &spoe,
        "[sluice]
spoe-agent sluice-agent
    messages sluice-check sluice-refund
    option var-prefix sluice
    option continue-on-error
    timeout hello 2s
    timeout idle 30s
    timeout processing 500ms
    use-backend sluice-spoa
spoe-message sluice-check
    args domain=str(inflight) 0.inflight=req.hdr(x-api-key)
    event on-frontend-http-request
spoe-message sluice-refund
    args domain=str(inflight) 0.inflight=var(txn.api_key) negative_hits=bool(true)
    event on-http-response
",
    )
    .unwrap();
    let template = std::fs::read_to_string(repo().join("examples/haproxy/haproxy.cfg")).unwrap();
    let marker = "    filter spoe engine sluice config ${SPOE_CONFIG}\n";
    assert!(template.contains(marker));
    let template = template.replace(
        marker,
        &format!("{marker}    http-request set-var(txn.api_key) req.hdr(x-api-key)\n"),
    );
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
    let conf_path = dir.join("haproxy.cfg");
    std::fs::write(&conf_path, conf).unwrap();
    let mut cmd = Command::new(haproxy);
    cmd.arg("-db").arg("-f").arg(&conf_path);
    (Proc::spawn("haproxy", cmd, dir.join("haproxy.log")), port)
}
