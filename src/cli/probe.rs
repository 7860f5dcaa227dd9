//! `sluice probe`, which the Helm chart's test hook runs (`helm test`): the release's HTTP port
//! answers `/healthcheck` with 200 and a rate-limit request on `/json` with an `overallCode`.

use std::process::ExitCode;

use serde_json::Value;

use super::http::{self, Client, Limits};

/// The request `sluice probe` sends to `/json`: a domain no config has, so it is answered OK
/// and counts nothing.
pub(crate) const PROBE_REQUEST: &str =
    r#"{"domain":"sluice-probe","descriptors":[{"entries":[{"key":"probe","value":"1"}]}]}"#;

/// `sluice probe --address HOST:PORT`: prints what it checked and exits 0, or prints what
/// failed and exits 1.
pub fn run(addr: &str) -> ExitCode {
    match probe(addr, http::LIMITS) {
        Ok(checked) => {
            println!("{checked}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sluice probe: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Checks the HTTP port at `addr`, each call within `limits` (both on one connection when
/// the server keeps it open). What it checked, or what failed.
pub fn probe(addr: &str, limits: Limits) -> Result<String, String> {
    let mut client = Client::new(addr, limits)?;
    let (health, json) = http::block_on(async {
        let health = client.get("/healthcheck").await?;
        if health.status != 200 {
            return Ok((health, None));
        }
        Ok((
            health,
            Some(client.post_json("/json", PROBE_REQUEST).await?),
        ))
    })?;
    let Some(json) = json else {
        return Err(format!(
            "{addr}/healthcheck answered {}: {}",
            health.status,
            health.body.trim()
        ));
    };
    let status = json.status;
    let answer: Value = serde_json::from_str(&json.body).map_err(|e| {
        format!(
            "{addr}/json answered {status} without JSON ({e}): {}",
            json.body.trim()
        )
    })?;
    match answer["overallCode"].as_str() {
        Some(code) if status == 200 || status == 429 => Ok(format!(
            "{addr}: /healthcheck 200, /json {status} with overallCode {code}"
        )),
        _ => Err(format!(
            "{addr}/json answered {status}: {}",
            json.body.trim()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::test_server::{Reply, serve};

    #[test]
    fn both_calls_go_over_one_kept_alive_connection() {
        let body = r#"{"overallCode":"OK"}"#;
        let mut server = serve(vec![
            Reply::length(200, "OK"),
            Reply::chunked(200, &[&body[..5], &body[5..]]),
        ]);
        let checked = probe(&server.addr, http::LIMITS).unwrap();
        assert_eq!(
            checked,
            format!(
                "{}: /healthcheck 200, /json 200 with overallCode OK",
                server.addr
            )
        );
        let requests = server.requests();
        assert_eq!(requests.len(), 2, "{requests:?}");
        assert!(requests[0].starts_with("GET /healthcheck HTTP/1.1\r\n"));
        assert!(requests[1].starts_with("POST /json HTTP/1.1\r\n"));
        assert!(requests[1].ends_with(PROBE_REQUEST), "{}", requests[1]);
        assert_eq!(server.connections(), 1);
    }

    #[test]
    fn a_failing_healthcheck_is_named_and_json_is_not_asked() {
        let mut server = serve(vec![Reply::length(503, "draining\n")]);
        let err = probe(&server.addr, http::LIMITS).unwrap_err();
        assert_eq!(
            err,
            format!("{}/healthcheck answered 503: draining", server.addr)
        );
        assert_eq!(server.requests().len(), 1);
    }
}
