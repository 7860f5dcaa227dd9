//! Redis down: once a Redis is known down, calls answer at once (a backend error: UNKNOWN, or
//! OK for a fail-open domain) instead of each waiting REDIS_TIMEOUT, and service resumes within
//! a few probe intervals of Redis coming back, with no restart of Sluice.
//!
//! REDIS_TIMEOUT is 2 s here, so "at once" ([`FAST`], 150 ms) cannot be mistaken for a timeout,
//! even on a slow, shared machine. Redis goes down two ways: killed (connections refused) and
//! stopped with SIGSTOP (connections accepted, nothing answered), which only deadlines reveal.

#![allow(
    clippy::disallowed_methods,
    reason = "tests time real processes, sockets and deadlines; Sluice's code reads time through crate::clock"
)]
use super::*;
use sluice::store::RedisLink;
use sluice::store::redis::BreakerStats;
use sluice_test_support::http::http;

/// The bound on a call answered without Redis.
const FAST: Duration = Duration::from_millis(150);
/// REDIS_TIMEOUT in these tests.
const TIMEOUT: Duration = Duration::from_secs(2);
/// The bound on resuming after Redis is back: a probe every 100 ms here, plus, after SIGCONT,
/// the probe in flight (up to max(REDIS_TIMEOUT, 1 s)), plus a slow machine's slack.
const RECOVERY: Duration = Duration::from_secs(5);

fn fast_settings(mut settings: RedisConfig) -> RedisConfig {
    settings.timeout = TIMEOUT;
    settings.breaker.probe_interval = Duration::from_millis(100);
    settings
}

fn hit(key: &str, unit: Unit) -> [Hit<'_>; 1] {
    [Hit {
        key,
        quota: Quota::fixed(1000, unit),
        hits: 1,
    }]
}

const NOW: Timestamp = Timestamp::from_secs(1_700_000_000);

/// Calls until one answers that Redis is down (bounded: three timeouts in a row at most).
async fn until_down(store: &RedisStore, hits: &[Hit<'_>]) {
    let start = Instant::now();
    loop {
        match apply(store, NOW, hits).await {
            Err(StoreError::Backend { message }) if message.contains("is down") => return,
            other => assert!(
                start.elapsed() < 5 * TIMEOUT,
                "Redis not taken for down: {other:?}"
            ),
        }
    }
}

/// `n` calls in a row each answer at once that Redis is down; returns the slowest.
async fn assert_fail_fast(store: &RedisStore, hits: &[Hit<'_>], n: usize) -> Duration {
    let mut slowest = Duration::ZERO;
    for i in 0..n {
        let started = Instant::now();
        let result = apply(store, NOW, hits).await;
        let took = started.elapsed();
        match result {
            Err(StoreError::Backend { message }) => {
                assert!(message.contains("is down"), "{message}");
                assert!(
                    message.contains("SLUICE_REDIS_PROBE_INTERVAL_MS"),
                    "{message}"
                );
            }
            other => panic!("call {i}: expected a backend error, got {other:?}"),
        }
        assert!(took < FAST, "call {i} took {took:?} with Redis down");
        slowest = slowest.max(took);
    }
    slowest
}

/// Calls until one succeeds; returns how long that took.
async fn until_answered(store: &RedisStore, hits: &[Hit<'_>]) -> Duration {
    let start = Instant::now();
    loop {
        match apply(store, NOW, hits).await {
            Ok(_) => return start.elapsed(),
            Err(e) => assert!(
                start.elapsed() < RECOVERY,
                "no answer {RECOVERY:?} after Redis came back: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn main_breaker(store: &RedisStore) -> BreakerStats {
    store.breakers()[0]
}

#[tokio::test]
async fn with_redis_killed_calls_answer_at_once_and_resume_when_it_returns() {
    if !redis_server_available() {
        return;
    }
    let port = free_port();
    let mut redis = Redis::start_on(port);
    let mut settings = fast_settings(redis.settings(0));
    // REDIS_HEALTH_CHECK_ACTIVE_CONNECTION: readiness follows the breaker, pushed.
    settings.breaker.health_follows_connection = true;
    let remote = store(&settings).await;
    let mut ready = remote.ready_changes();
    assert!(*ready.borrow_and_update());
    let h = hit("killed_", Unit::Hour);
    apply(&remote, NOW, &h).await.unwrap();
    assert!(main_breaker(&remote).up);

    redis.kill();
    until_down(&remote, &h).await;
    assert!(ready.has_changed().unwrap() && !*ready.borrow_and_update());
    assert!(!remote.is_ready());
    let slowest = assert_fail_fast(&remote, &h, 50).await;
    eprintln!("killed: 50 calls, slowest {slowest:?}");
    let b = main_breaker(&remote);
    assert!(!b.up && b.opens == 1 && b.fast_failures >= 50, "{b:?}");

    let _redis = Redis::start_on(port);
    let resumed = until_answered(&remote, &h).await;
    eprintln!("killed: answered {resumed:?} after Redis was back");
    assert!(main_breaker(&remote).up);
    assert!(ready.has_changed().unwrap() && *ready.borrow_and_update());
    assert!(remote.is_ready());
    // The restarted Redis is empty (no persistence): counting starts again.
    assert_eq!(apply(&remote, NOW, &h).await.unwrap()[0].remaining, 998);
}

#[tokio::test]
async fn with_redis_stopped_three_timeouts_open_the_breaker_and_sigcont_closes_it() {
    if !redis_server_available() {
        return;
    }
    let redis = Redis::start();
    let remote = Arc::new(store(&fast_settings(redis.settings(0))).await);
    let h = hit("stopped_", Unit::Hour);
    apply(&*remote, NOW, &h).await.unwrap();

    redis.pause();
    // Three concurrent calls time out together (SLUICE_REDIS_BREAKER_TIMEOUTS=3).
    let started = Instant::now();
    let calls: Vec<_> = (0..3)
        .map(|_| {
            let remote = remote.clone();
            tokio::spawn(async move { apply(&*remote, NOW, &hit("stopped_", Unit::Hour)).await })
        })
        .collect();
    for c in calls {
        let e = c.await.unwrap().unwrap_err().to_string();
        assert!(e.contains("REDIS_TIMEOUT"), "{e}");
    }
    assert!(started.elapsed() >= TIMEOUT, "no deadline was waited");
    let slowest = assert_fail_fast(&remote, &h, 50).await;
    eprintln!("stopped: 50 calls, slowest {slowest:?}");

    redis.resume();
    let resumed = until_answered(&remote, &h).await;
    eprintln!("stopped: answered {resumed:?} after SIGCONT");
    assert_eq!(main_breaker(&remote).opens, 1);
}

#[tokio::test]
async fn one_slow_call_among_answered_ones_does_not_open_the_breaker() {
    if !redis_server_available() {
        return;
    }
    let redis = Redis::start();
    let mut settings = redis.settings(0);
    settings.timeout = Duration::from_millis(300);
    let remote = store(&settings).await;
    let h = hit("slow_", Unit::Hour);
    for round in 0..3 {
        // A script that keeps Redis busy past REDIS_TIMEOUT: this call times out...
        let mut slow = redis::pipe();
        slow.cmd("EVAL")
            .arg("local t = redis.call('TIME'); local s = t[1] * 1e6 + t[2]; repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] - s > 500000; return 0")
            .arg(0);
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", redis.port)).unwrap();
        let no_deadline = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&no_deadline)
            .await
            .unwrap();
        let busy = tokio::spawn(async move { slow.query_async::<Vec<i64>>(&mut conn).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let e = apply(&remote, NOW, &h).await.unwrap_err().to_string();
        assert!(e.contains("REDIS_TIMEOUT"), "round {round}: {e}");
        busy.await.unwrap().unwrap();
        // ...and the next is answered, which resets the count.
        apply(&remote, NOW, &h).await.unwrap();
    }
    let b = main_breaker(&remote);
    assert!(b.up && b.opens == 0, "{b:?}");
}

#[tokio::test]
async fn the_per_second_redis_has_its_own_breaker() {
    if !redis_server_available() {
        return;
    }
    let (main, mut per_second) = (Redis::start(), Redis::start());
    let mut settings = fast_settings(main.settings(0));
    settings.per_second = Some(per_second.settings(0).main);
    let remote = store(&settings).await;
    let (second, minute) = (hit("ps_", Unit::Second), hit("pm_", Unit::Minute));
    apply(&remote, NOW, &second).await.unwrap();

    per_second.kill();
    until_down(&remote, &second).await;
    assert_fail_fast(&remote, &second, 10).await;
    // The main Redis is not down: its calls still count.
    for n in 1..=3 {
        let d = apply(&remote, NOW, &minute).await.unwrap();
        assert_eq!(d[0].remaining, 1000 - n);
    }
    let b = remote.breakers();
    assert_eq!(
        (b[0].target, b[0].up, b[1].target, b[1].up),
        ("main", true, "per_second", false)
    );
}

/// The peer cluster's write-behind copy fails at once too, so flushes do not queue behind
/// timeouts while Redis is stopped.
#[tokio::test]
async fn the_write_behind_link_fails_at_once_while_redis_is_stopped() {
    if !redis_server_available() {
        return;
    }
    let redis = Redis::start();
    let link = RedisLink::start("write_behind", &fast_settings(redis.settings(0)), &[]).unwrap();
    let mut pipe = redis::pipe();
    pipe.cmd("INCR").arg("wb_link");
    let start = Instant::now();
    while link.run(&pipe).await.is_err() {
        assert!(start.elapsed() < Duration::from_secs(10), "link never up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    redis.pause();
    let start = Instant::now();
    while link.breaker().up {
        assert!(start.elapsed() < 5 * TIMEOUT, "link never taken for down");
        let _ = link.run(&pipe).await;
    }
    for i in 0..20 {
        let started = Instant::now();
        let e = link.run(&pipe).await.unwrap_err().to_string();
        assert!(e.contains("is down"), "{e}");
        assert!(
            started.elapsed() < FAST,
            "flush {i}: {:?}",
            started.elapsed()
        );
    }
    redis.resume();
    let start = Instant::now();
    while link.run(&pipe).await.is_err() {
        assert!(start.elapsed() < RECOVERY, "link never back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(link.breaker().opens, 1);
}

/// A cluster node killed: the cluster's calls answer at once, and resume once it is back.
#[tokio::test]
async fn with_a_redis_cluster_node_killed_calls_answer_at_once_and_resume() {
    if !redis_server_available() {
        return;
    }
    let mut cluster = Cluster::start();
    let remote = store(&fast_settings(cluster.settings())).await;
    // Keys spread over every node's slots.
    let keys: Vec<String> = (0..12).map(|i| format!("node_{i}_")).collect();
    for k in &keys {
        apply(&remote, NOW, &hit(k, Unit::Hour)).await.unwrap();
    }

    let port = cluster.nodes[0].port;
    cluster.nodes[0].kill();
    let start = Instant::now();
    'down: loop {
        for k in &keys {
            if let Err(StoreError::Backend { message }) =
                apply(&remote, NOW, &hit(k, Unit::Hour)).await
                && message.contains("is down")
            {
                break 'down;
            }
        }
        assert!(
            start.elapsed() < 10 * TIMEOUT,
            "cluster never taken for down"
        );
    }
    eprintln!(
        "cluster: taken for down {:?} after the kill",
        start.elapsed()
    );
    let mut slowest = Duration::ZERO;
    for k in &keys {
        slowest = slowest.max(assert_fail_fast(&remote, &hit(k, Unit::Hour), 5).await);
    }
    eprintln!("cluster: 60 calls, slowest {slowest:?}");

    cluster.restart(0, port);
    let start = Instant::now();
    for k in &keys {
        until_answered(&remote, &hit(k, Unit::Hour)).await;
    }
    eprintln!(
        "cluster: every key answered {:?} after the node was back",
        start.elapsed()
    );
}

/// The binary: a fail-open domain answers OK and a fail-closed one UNKNOWN, both at once, while
/// Redis is killed; with REDIS_HEALTH_CHECK_ACTIVE_CONNECTION health fails meanwhile; `/stats`
/// counts the open; all without a restart once Redis is back.
#[test]
fn sluice_answers_at_once_while_redis_is_down_failing_open_where_asked() {
    if !redis_server_available() {
        return;
    }
    let port = free_port();
    let mut redis = Redis::start_on(port);
    let dir = tempfile::tempdir().unwrap();
    for domain in ["d", "open"] {
        std::fs::write(
            dir.path().join(format!("{domain}.yaml")),
            format!(
                "domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: 100}}\n"
            ),
        )
        .unwrap();
    }
    let debug = free_port();
    let sluice = Sluice::start(
        dir.path(),
        &[
            ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
            ("REDIS_URL", format!("127.0.0.1:{port}")),
            ("REDIS_TIMEOUT", "2s".to_owned()),
            ("SLUICE_REDIS_PROBE_INTERVAL_MS", "100".to_owned()),
            ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true".to_owned()),
            ("SLUICE_FAIL_OPEN_DOMAINS", "open".to_owned()),
            ("DEBUG_PORT", debug.to_string()),
        ],
    );
    sluice.wait_healthy();
    let json = |domain: &str| {
        let body = format!(
            r#"{{"domain":"{domain}","descriptors":[{{"entries":[{{"key":"k","value":"v"}}]}}]}}"#
        );
        let started = Instant::now();
        let status = sluice.status("POST", "/json", &body);
        (status, started.elapsed())
    };
    assert_eq!(json("d").0, Some(200));

    redis.kill();
    wait_for(
        "health to follow Redis down",
        Duration::from_secs(10),
        || {
            let _ = json("d");
            sluice.status("GET", "/healthcheck", "") == Some(500)
        },
    );
    let mut slowest = Duration::ZERO;
    for _ in 0..20 {
        let (closed, took_closed) = json("d");
        let (open, took_open) = json("open");
        // A backend error is a 400 on /json (UNKNOWN over gRPC); the fail-open domain is OK.
        assert_eq!((closed, open), (Some(400), Some(200)));
        slowest = slowest.max(took_closed).max(took_open);
    }
    eprintln!("binary, Redis killed: 40 /json calls, slowest {slowest:?}");
    assert!(slowest < FAST, "{slowest:?}");
    let grpc_started = Instant::now();
    let code = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(grpc_code(sluice.grpc));
    assert_eq!(code, tonic::Code::Unknown);
    // The gRPC client connects first: allow for that.
    assert!(grpc_started.elapsed() < Duration::from_secs(1));
    let stats = http(debug, "GET", "/stats", "").expect("/stats").1;
    assert!(stats.contains("sluice.redis.main.up: 0"), "{stats}");
    assert!(
        stats.contains("sluice.redis.main.breaker_opens: 1"),
        "{stats}"
    );

    let _redis = Redis::start_on(port);
    let back = Instant::now();
    wait_for("calls to resume", RECOVERY, || json("d").0 == Some(200));
    eprintln!(
        "binary: /json answered {:?} after Redis was back",
        back.elapsed()
    );
    wait_for("health to follow Redis up", RECOVERY, || {
        sluice.status("GET", "/healthcheck", "") == Some(200)
    });
}
