//! `sluice explain`: the query it sends to a running Sluice's `/debug/explain` (or decodes
//! itself, against a config file), the bounded fetch, and the text it prints from the JSON
//! answer ([`crate::service::RateLimitService::explain`] makes it). And `sluice probe`, which
//! the Helm chart's test hook runs: the release answers `/healthcheck` and a `/json` request.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;

/// The most bytes of an answer `sluice explain` reads from a debug port.
pub const MAX_ANSWER_BYTES: u64 = 8 << 20;
/// How long `sluice explain` waits for a debug port to connect and to answer.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// The query string of `/debug/explain` (the `/forward-auth` query form) for `domain`,
/// `descriptors` (each `k=v&k2=v2`) and `hits_addend`.
pub fn query(domain: &str, descriptors: &[String], hits_addend: u32) -> String {
    let mut q = format!("domain={}", encode(domain));
    for d in descriptors {
        q.push_str("&descriptor=");
        q.push_str(&encode(d));
    }
    if hits_addend > 0 {
        q.push_str(&format!("&hits_addend={hits_addend}"));
    }
    q
}

/// Percent-encodes all but unreserved characters and `=` (which the query form splits a
/// descriptor's entries on, after decoding `%26` back to `&`).
fn encode(text: &str) -> String {
    crate::percent::encode(text, b"=")
}

/// A request to explain: in the query form of `/forward-auth` ([`query`]), or a `/json` body.
pub enum Asked {
    Query(String),
    Json(String),
}

/// The request `asked` as the service's, decoded as the debug port decodes it.
pub fn decode(asked: &Asked, max_bytes: usize) -> Result<crate::descriptor::Request, String> {
    match asked {
        Asked::Query(q) => super::forward_auth::forward_auth_request(
            Some(q),
            &axum::http::HeaderMap::new(),
            max_bytes,
        )
        .map(|(request, _)| request)
        .map_err(|e| e.to_string()),
        Asked::Json(body) if body.len() > max_bytes => Err(format!(
            "the request is larger than {max_bytes} bytes (SLUICE_MAX_REQUEST_BYTES)"
        )),
        Asked::Json(body) => super::json::request_from_json(body.as_bytes()),
    }
}

/// `/debug/explain` from the debug port at `addr` (plain HTTP/1.1; a GET with the query, or a
/// POST of the JSON), within [`TIMEOUT`] and [`MAX_ANSWER_BYTES`]; the answer's JSON, or what
/// went wrong.
pub fn fetch(addr: &str, asked: &Asked) -> Result<Value, String> {
    let (status, body) = match asked {
        Asked::Query(q) => call(addr, "GET", &format!("/debug/explain?{q}"), "")?,
        Asked::Json(json) => call(addr, "POST", "/debug/explain", json)?,
    };
    if status != 200 {
        return Err(format!("{addr} answered {status}: {}", body.trim()));
    }
    serde_json::from_str(&body).map_err(|e| format!("{addr} answered no JSON: {e}"))
}

/// The request `sluice probe` sends to `/json`: a domain no config has, so it is answered OK
/// and counts nothing.
pub const PROBE_REQUEST: &str =
    r#"{"domain":"sluice-probe","descriptors":[{"entries":[{"key":"probe","value":"1"}]}]}"#;

/// `sluice probe`: the HTTP port at `addr` answers `/healthcheck` with 200 and a rate-limit
/// request on `/json` with an `overallCode`. What it checked, or what failed.
pub fn probe(addr: &str) -> Result<String, String> {
    let (status, body) = call(addr, "GET", "/healthcheck", "")?;
    if status != 200 {
        return Err(format!(
            "{addr}/healthcheck answered {status}: {}",
            body.trim()
        ));
    }
    let (status, body) = call(addr, "POST", "/json", PROBE_REQUEST)?;
    let answer: Value = serde_json::from_str(&body).map_err(|e| {
        format!(
            "{addr}/json answered {status} without JSON ({e}): {}",
            body.trim()
        )
    })?;
    match answer["overallCode"].as_str() {
        Some(code) if status == 200 || status == 429 => Ok(format!(
            "{addr}: /healthcheck 200, /json {status} with overallCode {code}"
        )),
        _ => Err(format!("{addr}/json answered {status}: {}", body.trim())),
    }
}

/// One plain HTTP/1.1 call to `addr`, within [`TIMEOUT`] and [`MAX_ANSWER_BYTES`]: the status
/// and the body.
fn call(addr: &str, method: &str, path: &str, body: &str) -> Result<(u16, String), String> {
    use std::net::ToSocketAddrs;
    let target = addr
        .to_socket_addrs()
        .map_err(|e| format!("--debug-address {addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("--debug-address {addr}: no address"))?;
    let mut s = TcpStream::connect_timeout(&target, TIMEOUT)
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    s.set_read_timeout(Some(TIMEOUT))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(TIMEOUT))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| format!("cannot send to {addr}: {e}"))?;
    let mut raw = Vec::new();
    s.take(MAX_ANSWER_BYTES)
        .read_to_end(&mut raw)
        .map_err(|e| format!("no answer from {addr}: {e}"))?;
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{addr} did not answer HTTP"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{addr} did not answer HTTP"))?;
    Ok((status, body.to_owned()))
}

/// The explanation as text for a terminal.
pub fn render(v: &Value) -> String {
    let mut out = String::new();
    let domain = v["domain"].as_str().unwrap_or_default();
    if v["domain_loaded"] == false {
        out.push_str(&format!("domain {domain}: {}\n", text(&v["why"])));
        return out;
    }
    out.push_str(&format!("domain {domain}\n"));
    for d in v["descriptors"].as_array().into_iter().flatten() {
        out.push_str(&descriptor_text(d));
    }
    if let Some(code) = v.get("overall_code") {
        out.push_str(&format!("overall: {}\n", text(code)));
    }
    if let Some(note) = v.get("global_shadow_mode") {
        out.push_str(&format!("({})\n", text(note)));
    }
    out
}

/// One descriptor of the explanation as text.
fn descriptor_text(d: &Value) -> String {
    let mut out = String::new();
    let entries: Vec<&str> = d["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    out.push_str(&format!(
        "descriptor {}: {}\n",
        d["index"],
        entries.join(", ")
    ));
    if let Some(o) = d.get("override") {
        out.push_str(&format!(
            "  request override: {} per {} (fixed window); the config is not consulted\n",
            o["requests_per_unit"],
            text(&o["unit"])
        ));
    }
    for s in d["path"].as_array().into_iter().flatten() {
        match s["matched"].as_str() {
            Some(node) => out.push_str(&format!(
                "  level {}: {} matched `{node}` ({}){}\n",
                s["level"],
                text(&s["entry"]),
                text(&s["how"]),
                s["limit"]
                    .as_str()
                    .map_or(String::new(), |l| format!(", limit {l}"))
            )),
            None => out.push_str(&format!(
                "  level {}: {} matched nothing\n",
                s["level"],
                text(&s["entry"])
            )),
        }
    }
    if let Some(why) = d.get("why") {
        out.push_str(&format!("  no limit: {}\n", text(why)));
    }
    if let Some(l) = d.get("limit") {
        out.push_str(&limit_text(l));
    }
    if let Some(by) = d.get("replaced_by") {
        out.push_str(&format!(
            "  replaced by {by} (`replaces`): answers OK, uncounted\n"
        ));
    }
    for c in d["counters"].as_array().into_iter().flatten() {
        out.push_str(&format!("  counter {}", text(&c["key"])));
        if let Some(count) = c.get("count") {
            out.push_str(&counter_text(c, count, &d["hits"]));
        }
        out.push('\n');
    }
    if let Some(code) = d.get("code") {
        out.push_str(&format!("  answer: {}\n", text(code)));
    }
    out
}

/// A counter's state as read: a concurrency limit's as slots, the others' as a count.
fn counter_text(c: &Value, count: &Value, hits: &Value) -> String {
    let slots = text(&c["algorithm"]) == "concurrency";
    let (what, refused) = if slots {
        (
            format!(
                "{count} slot(s) held, {} free, the oldest frees itself in",
                c["remaining"]
            ),
            "more would be refused",
        )
    } else {
        (
            format!("count {count}, remaining {}, resets in", c["remaining"]),
            "more hit(s) would be refused",
        )
    };
    let refusal = if c["would_refuse"] == true {
        format!(", {hits} {refused}")
    } else {
        String::new()
    };
    format!(": {what} {}s{refusal}", c["reset_after_secs"])
}

fn limit_text(l: &Value) -> String {
    let mut out = format!("  limit {}", text(&l["full_key"]));
    if l["unlimited"] == true {
        out.push_str(": unlimited (always OK, never counted)");
    }
    for flag in ["shadow_mode", "quota_mode"] {
        if l[flag] == true {
            out.push_str(&format!(", {flag}"));
        }
    }
    if let Some(r) = l["replaces"].as_array().filter(|r| !r.is_empty()) {
        out.push_str(&format!(", replaces {}", Value::Array(r.clone())));
    }
    out.push('\n');
    for b in l["blocks"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "    {} per {}{} ({}{}{}){}\n",
            b["requests_per_unit"],
            b["unit_multiplier"]
                .as_u64()
                .filter(|m| *m > 1)
                .map_or(String::new(), |m| format!("{m} ")),
            text(&b["unit"]),
            text(&b["algorithm"]),
            b["burst"]
                .as_u64()
                .map_or(String::new(), |n| format!(", burst {n}")),
            if b["charge_refused"] == true && b["algorithm"] != "fixed_window" {
                ", charge_refused"
            } else {
                ""
            },
            b["name"]
                .as_str()
                .filter(|n| !n.is_empty())
                .map_or(String::new(), |n| format!(" name {n}")),
        ));
    }
    out
}

/// A JSON string as text (anything else as JSON).
fn text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_concurrency_counter_reads_as_slots() {
        let v = serde_json::json!({
            "domain": "ex",
            "descriptors": [{
                "index": 0, "entries": ["inflight=i"], "hits": 1,
                "counters": [{
                    "key": "ex_inflight_i_", "algorithm": "concurrency", "count": 2,
                    "remaining": 1, "reset_after_secs": 4, "would_refuse": false,
                }],
            }],
        });
        assert!(
            render(&v).contains(
                "counter ex_inflight_i_: 2 slot(s) held, 1 free, the oldest frees itself in 4s\n"
            ),
            "{}",
            render(&v)
        );
    }

    #[test]
    fn the_query_keeps_entries_together_and_encodes_the_rest() {
        let q = query("edge", &["k=v&k2=a b".into(), "x=%".into()], 3);
        assert_eq!(
            q,
            "domain=edge&descriptor=k=v%26k2=a%20b&descriptor=x=%25&hits_addend=3"
        );
    }
}
