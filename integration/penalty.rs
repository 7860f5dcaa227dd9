//! `penalty_seconds` (issue 52) as a client sees it, shared by the backends' tests
//! (`refunds.rs`) and the cluster's (`cluster.rs`): the limit is `login`, 3 per second with
//! `penalty_seconds: 3`.

#![allow(
    clippy::disallowed_methods,
    reason = "tests time real processes, sockets and deadlines; Sluice's code reads time through crate::clock"
)]

use std::time::{Duration, Instant};

use sluice_test_support::process;

/// `/json`'s answer on `http` for `login=<value>`: OK, and the seconds its status says to the
/// reset.
pub fn login(http: u16, value: &str) -> (bool, u64) {
    let body = format!(
        r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"login","value":"{value}"}}]}}]}}"#
    );
    let (_, body) = sluice_test_support::http::http(http, "POST", "/json", &body).expect("answer");
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    let reset = v["statuses"][0]["durationUntilReset"]
        .as_str()
        .unwrap_or("");
    let secs = reset.trim_end_matches('s').parse().unwrap_or(u64::MAX);
    (v["overallCode"] == "OK", secs)
}

/// The issue's case through `ask` (a `login` value: OK, and seconds to the reset). Four
/// requests early in a second: the 4th refused, saying 3 s; a second later still refused (the
/// window has reset), saying when the penalty ends; admitted again 3 s after the refusal.
pub fn steps(mut ask: impl FnMut(&str) -> (bool, u64)) {
    // Early in a second, so that the four requests share its window.
    let into = process::unix_millis() % 1_000;
    std::thread::sleep(Duration::from_millis((1_050 - into) % 1_000));
    let value = format!("u{}", process::unix_millis());
    for _ in 0..3 {
        assert!(ask(&value).0, "the first three are admitted");
    }
    let refused_at = Instant::now();
    assert_eq!(
        ask(&value),
        (false, 3),
        "the 4th is refused, for the penalty"
    );
    std::thread::sleep(Duration::from_millis(1_100));
    let (ok, reset) = ask(&value);
    assert!(!ok, "refused in the next second, the window reset");
    assert!((1..=2).contains(&reset), "the penalty ends in {reset} s");
    let left = Duration::from_millis(3_100).saturating_sub(refused_at.elapsed());
    std::thread::sleep(left);
    assert!(ask(&value).0, "admitted 3 s after the refusal");
}
