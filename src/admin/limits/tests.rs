//! The runtime limits API, call by call: every status it answers, and what each change does.

use std::path::Path;

use serde_json::json;

use super::*;
use crate::clock::{ManualClock, Timestamp};
use crate::config::runtime::file::SaveError;
use crate::config::{LoadOptions, parse_files};
use crate::runtime_limits::{NotSettled, Settling};
use crate::service::{RateLimitService, ServiceOptions};
use crate::store::MemoryStore;

const YAML: &str = "domain: edge
descriptors:
  - key: tenant
    value: acme
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: plan
    value: gold*
    rate_limit: {unit: hour, requests_per_unit: 7}
";

const TOKENS: &str = "ops s3cr3t\nci-bot 0ther\n";

struct Fixture {
    api: Arc<LimitsApi>,
    config: ConfigHandle,
    dir: tempfile::TempDir,
    service: Arc<RateLimitService<MemoryStore>>,
}

/// The API over [`YAML`], holding at most `max` runtime limits, its changes given to the sinks
/// `sinks` makes for the config.
fn fixture_with(max: usize, sinks: impl FnOnce(&ConfigHandle) -> Vec<Arc<dyn Sink>>) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, TOKENS).unwrap();
    let files = [("edge.yaml".to_owned(), YAML.to_owned())];
    let cfg = parse_files(&files, &LoadOptions::default()).unwrap();
    let config = ConfigHandle::with_max_runtime_limits(Some(cfg), max);
    let clock = Arc::new(ManualClock::new(Timestamp::from_secs(1_795_764_309)));
    let service = Arc::new(RateLimitService::new(
        config.clone(),
        Arc::new(MemoryStore::new(1000)),
        clock.clone(),
        ServiceOptions::default(),
    ));
    let api = LimitsApi::new(
        config.clone(),
        AdminAuth::from_file(tokens).unwrap(),
        3,
        clock,
        service.clone(),
        sinks(&config),
        Arc::from("n1"),
    );
    Fixture {
        api: Arc::new(api),
        config,
        dir,
        service,
    }
}

fn fixture() -> Fixture {
    fixture_with(100, |_| Vec::new())
}

const OPS: Option<&str> = Some("Bearer s3cr3t");

async fn call(
    f: &Fixture,
    method: &str,
    uri: &str,
    token: Option<&str>,
    body: &str,
) -> (StatusCode, String) {
    let mut headers = HeaderMap::new();
    if let Some(t) = token {
        headers.insert(header::AUTHORIZATION, t.parse().unwrap());
    }
    let response = handle(
        Arc::clone(&f.api),
        method.parse().unwrap(),
        uri.parse().unwrap(),
        headers,
        Body::from(body.to_owned()),
    )
    .await;
    crate::api::body::answer(response).await
}

/// The `error` of a JSON error answer.
fn message(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    v["error"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn a_limit_is_created_read_replaced_listed_and_deleted() {
    let f = fixture();
    let uri = "/limits/edge/tenant=acme/path=%2Fapi%2Fv1";
    let body = r#"{"unit":"minute","requests_per_unit":2}"#;
    let (status, got) = call(&f, "PUT", uri, OPS, body).await;
    assert_eq!(status, StatusCode::CREATED, "{got}");
    assert_eq!(got, "{\"requests_per_unit\":2,\"unit\":\"minute\"}\n");
    let (status, got) = call(&f, "GET", uri, OPS, "").await;
    assert_eq!(
        (status, got.trim()),
        (StatusCode::OK, r#"{"requests_per_unit":2,"unit":"minute"}"#)
    );
    let raised = r#"{"unit":"minute","requests_per_unit":20,"shadow_mode":true}"#;
    let (status, _) = call(&f, "PUT", uri, OPS, raised).await;
    assert_eq!(status, StatusCode::OK);
    // It applies to the next decision.
    let cfg = f.config.current().unwrap();
    let m = cfg
        .domain("edge")
        .unwrap()
        .lookup(&[
            crate::descriptor::Entry::new("tenant", "acme"),
            crate::descriptor::Entry::new("path", "/api/v1"),
        ])
        .unwrap();
    assert_eq!(m.limit.slowest_block().unwrap().requests_per_unit, 20);
    assert!(m.limit.shadow_mode);
    let (_, _) = call(&f, "PUT", "/limits/edge/tenant=b", OPS, body).await;
    let (status, list) = call(&f, "GET", "/limits/edge", OPS, "").await;
    assert_eq!(status, StatusCode::OK);
    let list: Value = serde_json::from_str(&list).unwrap();
    assert_eq!(
        list,
        json!({"domain": "edge", "next": null, "limits": [
            {"path": "tenant=acme/path=%2Fapi%2Fv1", "limit": {"unit": "minute", "requests_per_unit": 20, "shadow_mode": true}},
            {"path": "tenant=b", "limit": {"unit": "minute", "requests_per_unit": 2}},
        ]})
    );
    let (status, got) = call(&f, "DELETE", uri, OPS, "").await;
    assert_eq!((status, got.as_str()), (StatusCode::NO_CONTENT, ""));
    let (status, got) = call(&f, "GET", uri, OPS, "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        message(&got),
        "no runtime limit at edge/tenant=acme/path=%2Fapi%2Fv1"
    );
    let (status, _) = call(&f, "DELETE", uri, OPS, "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(f.api.changes(), (3, 1));
}

#[tokio::test]
async fn the_list_comes_a_page_at_a_time() {
    let f = fixture();
    for i in 0..5 {
        let uri = format!("/limits/edge/tenant=t{i}");
        let (status, _) = call(
            &f,
            "PUT",
            &uri,
            OPS,
            r#"{"unit":"hour","requests_per_unit":1}"#,
        )
        .await;
        assert_eq!(status, StatusCode::CREATED);
    }
    let page = |body: &str| -> (Vec<String>, Value) {
        let v: Value = serde_json::from_str(body).unwrap();
        let paths = v["limits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["path"].as_str().unwrap().to_owned())
            .collect();
        (paths, v["next"].clone())
    };
    let (_, body) = call(&f, "GET", "/limits/edge?limit=2", OPS, "").await;
    assert_eq!(
        page(&body),
        (
            vec!["tenant=t0".to_owned(), "tenant=t1".to_owned()],
            json!("tenant=t1")
        )
    );
    let (_, body) = call(&f, "GET", "/limits/edge?limit=2&after=tenant%3Dt3", OPS, "").await;
    assert_eq!(page(&body), (vec!["tenant=t4".to_owned()], Value::Null));
    let (_, body) = call(&f, "GET", "/limits/nowhere", OPS, "").await;
    assert_eq!(page(&body), (Vec::new(), Value::Null));
}

/// A refused call: method, URI, token, body; the status and the error it is answered.
type Refused = (
    &'static str,
    &'static str,
    Option<&'static str>,
    &'static str,
    StatusCode,
    &'static str,
);

const PUT_BODY: &str = r#"{"unit":"minute","requests_per_unit":2}"#;

const REFUSALS: &[Refused] = &[
    (
        "GET",
        "/limits/edge",
        None,
        "",
        StatusCode::UNAUTHORIZED,
        "an admin call needs the header `Authorization: Bearer <token>`",
    ),
    (
        "GET",
        "/limits/edge",
        Some("Bearer nope"),
        "",
        StatusCode::FORBIDDEN,
        "the bearer token is not one of SLUICE_ADMIN_TOKEN_FILE's",
    ),
    (
        "PUT",
        "/limits/edge/k=%zz",
        OPS,
        PUT_BODY,
        StatusCode::BAD_REQUEST,
        "segment 2: a `%` not followed by two hex digits, or not UTF-8",
    ),
    (
        "PUT",
        "/limits/edge/=v",
        OPS,
        PUT_BODY,
        StatusCode::BAD_REQUEST,
        "segment 2: an empty key (a descriptor key cannot be empty)",
    ),
    (
        "PUT",
        "/limits/edge/a/b/c/d/e/f/g/h/i",
        OPS,
        PUT_BODY,
        StatusCode::BAD_REQUEST,
        "a runtime limit's path has at most 8 levels",
    ),
    (
        "PUT",
        "/limits/_history/k=v",
        OPS,
        PUT_BODY,
        StatusCode::BAD_REQUEST,
        "segment 1: _history is the audit log, not a domain",
    ),
    (
        "PUT",
        "/limits/edge/k=v?dry_run=maybe",
        OPS,
        PUT_BODY,
        StatusCode::BAD_REQUEST,
        "dry_run=maybe: expected true or false",
    ),
    (
        "GET",
        "/limits/edge?limit=0",
        OPS,
        "",
        StatusCode::BAD_REQUEST,
        "limit=0: expected a number from 1 to 10000",
    ),
    (
        "GET",
        "/limits/edge?page=2",
        OPS,
        "",
        StatusCode::BAD_REQUEST,
        "unknown query parameter \"page\" (the API takes dry_run, budget, after and limit)",
    ),
    (
        "PUT",
        "/limits/edge/k=v",
        OPS,
        "{unit: minute}",
        StatusCode::BAD_REQUEST,
        "the body is not JSON: key must be a string at line 1 column 2",
    ),
    (
        "PUT",
        "/limits/edge/k=v",
        OPS,
        "[1]",
        StatusCode::BAD_REQUEST,
        "the body must be a JSON object of rate_limit fields",
    ),
    (
        "PUT",
        "/limits/edge/k=v",
        OPS,
        r#"{"unit":"fortnight","requests_per_unit":1}"#,
        StatusCode::BAD_REQUEST,
        "invalid rate limit unit 'fortnight'",
    ),
    (
        "PUT",
        "/limits/edge/k=v",
        OPS,
        r#"{"unit":"day","unlimited":true}"#,
        StatusCode::BAD_REQUEST,
        "should not specify rate limit unit when unlimited",
    ),
    (
        "PUT",
        "/limits/edge/plan=gold*",
        OPS,
        PUT_BODY,
        StatusCode::BAD_REQUEST,
        "plan=gold*: a runtime limit's value cannot contain '*' (wildcards come from the YAML; set the limit per value)",
    ),
    (
        "PUT",
        "/limits/edge/plan",
        OPS,
        PUT_BODY,
        StatusCode::BAD_REQUEST,
        "plan: a key-only runtime level where the YAML has the wildcard 'plan_gold*' on the same key would apply only to the values the wildcard does not match; set the limit per value instead",
    ),
    (
        "POST",
        "/limits/edge/k=v",
        OPS,
        PUT_BODY,
        StatusCode::METHOD_NOT_ALLOWED,
        "this path takes GET, PUT, DELETE",
    ),
    (
        "DELETE",
        "/limits/edge",
        OPS,
        "",
        StatusCode::METHOD_NOT_ALLOWED,
        "this path takes GET",
    ),
    (
        "PUT",
        "/limits/_history",
        OPS,
        PUT_BODY,
        StatusCode::METHOD_NOT_ALLOWED,
        "this path takes GET",
    ),
];

#[tokio::test]
async fn every_refusal_says_what_is_wrong() {
    let f = fixture();
    for (method, uri, token, body, status, want) in REFUSALS {
        let (got_status, got) = call(&f, method, uri, *token, body).await;
        assert_eq!(
            (got_status, message(&got)),
            (*status, (*want).to_owned()),
            "{method} {uri}"
        );
    }
    let big = format!(
        r#"{{"unit":"minute","requests_per_unit":1,"name":"{}"}}"#,
        "n".repeat(MAX_BODY_BYTES)
    );
    let (status, got) = call(&f, "PUT", "/limits/edge/k=v", OPS, &big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{got}");
    // 401 says how to authenticate.
    let mut headers = HeaderMap::new();
    headers.insert(header::AUTHORIZATION, "Basic x".parse().unwrap());
    let response = handle(
        Arc::clone(&f.api),
        Method::GET,
        "/limits/edge".parse().unwrap(),
        headers,
        Body::empty(),
    )
    .await;
    assert_eq!(response.headers()[header::WWW_AUTHENTICATE], "Bearer");
    // Nothing refused changed anything.
    assert_eq!(f.config.runtime(|s| s.len()), 0);
    assert_eq!(f.api.history.json(), json!([]));
}

#[tokio::test]
async fn past_the_cap_a_new_path_is_507_and_a_change_still_applies() {
    let f = fixture_with(1, |_| Vec::new());
    let body = r#"{"unit":"minute","requests_per_unit":2}"#;
    assert_eq!(
        call(&f, "PUT", "/limits/edge/k=a", OPS, body).await.0,
        StatusCode::CREATED
    );
    let (status, got) = call(&f, "PUT", "/limits/edge/k=b", OPS, body).await;
    assert_eq!(status, StatusCode::INSUFFICIENT_STORAGE);
    assert!(message(&got).contains("SLUICE_MAX_RUNTIME_LIMITS"), "{got}");
    assert_eq!(
        call(&f, "PUT", "/limits/edge/k=a", OPS, body).await.0,
        StatusCode::OK
    );
}

#[tokio::test]
async fn without_a_token_file_every_call_is_403() {
    let f = fixture();
    let off = LimitsApi::new(
        f.config.clone(),
        AdminAuth::off(),
        3,
        Arc::new(ManualClock::new(Timestamp::from_secs(0))),
        Arc::clone(&f.api.explainer),
        Vec::new(),
        Arc::from("n1"),
    );
    let off = Fixture {
        api: Arc::new(off),
        config: f.config.clone(),
        dir: tempfile::tempdir().unwrap(),
        service: f.service.clone(),
    };
    let (status, got) = call(&off, "GET", "/limits/edge", OPS, "").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        message(&got),
        "runtime limits are off: set SLUICE_ADMIN_TOKEN_FILE to a file of bearer tokens"
    );
}

#[tokio::test]
async fn tokens_rotate_without_a_restart() {
    let f = fixture();
    let tokens = f.dir.path().join("tokens");
    std::fs::write(&tokens, "ops n3w-s3cr3t\n").unwrap();
    // The file's change is seen by its metadata (size here: the same second may pass).
    let (status, _) = call(&f, "GET", "/limits/edge", OPS, "").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = call(&f, "GET", "/limits/edge", Some("Bearer n3w-s3cr3t"), "").await;
    assert_eq!(status, StatusCode::OK);
    // A file that does not parse keeps the tokens in force.
    std::fs::write(&tokens, "a b c d\n").unwrap();
    let (status, _) = call(&f, "GET", "/limits/edge", Some("Bearer n3w-s3cr3t"), "").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_dry_run_explains_the_change_and_makes_none() {
    let f = fixture();
    let uri = "/limits/edge/tenant=acme?dry_run=true";
    let (status, got) = call(
        &f,
        "PUT",
        uri,
        OPS,
        r#"{"unit":"second","requests_per_unit":3}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{got}");
    let v: Value = serde_json::from_str(&got).unwrap();
    assert_eq!(v["would"], "create");
    assert_eq!(v["old"], Value::Null);
    let limit = &v["explain"]["descriptors"][0]["limit"];
    assert_eq!(limit["source"], "runtime", "{got}");
    assert_eq!(limit["blocks"][0]["requests_per_unit"], 3, "{got}");
    assert_eq!(
        v["explain"]["descriptors"][0]["counters"][0]["key"],
        "edge_tenant_acme_"
    );
    // Nothing changed: the YAML's limit still applies.
    let (status, _) = call(&f, "GET", "/limits/edge/tenant=acme", OPS, "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(f.api.history.json(), json!([]));
    call(
        &f,
        "PUT",
        "/limits/edge/tenant=acme",
        OPS,
        r#"{"unit":"second","requests_per_unit":3}"#,
    )
    .await;
    let (status, got) = call(&f, "DELETE", uri, OPS, "").await;
    assert_eq!(status, StatusCode::OK, "{got}");
    let v: Value = serde_json::from_str(&got).unwrap();
    assert_eq!(
        (v["would"].as_str(), v["new"].clone()),
        (Some("delete"), Value::Null)
    );
    assert_eq!(
        v["explain"]["descriptors"][0]["limit"]["source"], "config",
        "{got}"
    );
    assert_eq!(
        call(&f, "GET", "/limits/edge/tenant=acme", OPS, "").await.0,
        StatusCode::OK
    );
    assert_eq!(
        call(&f, "DELETE", "/limits/edge/tenant=zed?dry_run", OPS, "")
            .await
            .0,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn every_change_is_in_the_history_with_who_made_it() {
    let f = fixture();
    let a = r#"{"unit":"minute","requests_per_unit":1}"#;
    let b = r#"{"unit":"minute","requests_per_unit":2}"#;
    call(&f, "PUT", "/limits/edge/k=v", OPS, a).await;
    call(&f, "PUT", "/limits/edge/k=v", Some("Bearer 0ther"), b).await;
    call(&f, "DELETE", "/limits/edge/k=v", OPS, "").await;
    call(&f, "PUT", "/limits/edge/k=w", OPS, a).await;
    let (status, got) = call(&f, "GET", "/limits/_history", Some("Bearer 0ther"), "").await;
    assert_eq!(status, StatusCode::OK);
    let v: Value = serde_json::from_str(&got).unwrap();
    // The last 3 (SLUICE_RUNTIME_HISTORY in this fixture), oldest first.
    assert_eq!(
        v,
        json!([
            {"time": "2026-11-27T07:25:09.000Z", "who": "ci-bot", "op": "put", "domain": "edge", "path": "k=v",
             "old": {"unit": "minute", "requests_per_unit": 1}, "new": {"unit": "minute", "requests_per_unit": 2}},
            {"time": "2026-11-27T07:25:09.000Z", "who": "ops", "op": "delete", "domain": "edge", "path": "k=v",
             "old": {"unit": "minute", "requests_per_unit": 2}, "new": null},
            {"time": "2026-11-27T07:25:09.000Z", "who": "ops", "op": "put", "domain": "edge", "path": "k=w",
             "old": null, "new": {"unit": "minute", "requests_per_unit": 1}},
        ])
    );
}

/// Durability that fails: the change applies, and the caller is told it is not saved.
struct Unsaved;

impl Sink for Unsaved {
    fn settled<'a>(&'a self, _: u64, _: &'a Replicated) -> Settling<'a> {
        Box::pin(async {
            Err(NotSettled::Unsaved(SaveError::Failed {
                path: "/nowhere/limits.json".into(),
                cause: Arc::new(std::io::Error::other("read-only file system")),
            }))
        })
    }
}

/// A peer cluster whose push missed two peers.
struct MissedTwo;

impl Sink for MissedTwo {
    fn settled<'a>(&'a self, _: u64, _: &'a Replicated) -> Settling<'a> {
        Box::pin(async { Ok(vec!["10.0.0.2:8090".to_owned(), "10.0.0.3:8090".to_owned()]) })
    }
}

#[tokio::test]
async fn a_change_some_peers_missed_applies_and_names_them() {
    let f = fixture_with(10, |_| vec![Arc::new(MissedTwo)]);
    let body = r#"{"unit":"minute","requests_per_unit":1}"#;
    for (method, status) in [
        ("PUT", StatusCode::CREATED),
        ("DELETE", StatusCode::NO_CONTENT),
    ] {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, OPS.unwrap().parse().unwrap());
        let response = handle(
            Arc::clone(&f.api),
            method.parse().unwrap(),
            "/limits/edge/k=v".parse().unwrap(),
            headers,
            Body::from(if method == "PUT" { body } else { "" }),
        )
        .await;
        assert_eq!(response.status(), status, "{method}");
        assert_eq!(
            response
                .headers()
                .get(MISSED_PEERS)
                .map(|v| v.to_str().unwrap()),
            Some("10.0.0.2:8090, 10.0.0.3:8090"),
            "{method}"
        );
    }
    // Without misses, no header.
    let g = fixture_with(10, |_| Vec::new());
    let mut headers = HeaderMap::new();
    headers.insert(header::AUTHORIZATION, OPS.unwrap().parse().unwrap());
    let response = handle(
        Arc::clone(&g.api),
        Method::PUT,
        "/limits/edge/k=v".parse().unwrap(),
        headers,
        Body::from(body),
    )
    .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert!(response.headers().get(MISSED_PEERS).is_none());
}

#[tokio::test]
async fn a_change_that_cannot_be_saved_is_503_and_says_so() {
    let f = fixture_with(10, |_| vec![Arc::new(Unsaved)]);
    let (status, got) = call(
        &f,
        "PUT",
        "/limits/edge/k=v",
        OPS,
        r#"{"unit":"minute","requests_per_unit":1}"#,
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        message(&got),
        "the change applies on this node but is not saved: /nowhere/limits.json: read-only file system"
    );
}

#[tokio::test]
async fn with_a_limits_file_a_change_is_answered_once_saved() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runtime-limits.json");
    let mut task = None;
    let f = fixture_with(100, |config| {
        let (saver, saving) =
            crate::config::runtime::file::Saver::spawn(config.clone(), path.clone());
        task = Some(saving);
        vec![saver]
    });
    let (status, _) = call(
        &f,
        "PUT",
        "/limits/edge/k=v",
        OPS,
        r#"{"unit":"minute","requests_per_unit":1}"#,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_saved(
        &path,
        &[
            "{\"domain\":\"edge\",\"levels\":[[\"k\",\"v\"]],\"limit\":{\"requests_per_unit\":1,\"unit\":\"minute\"},\"at_us\":1795764309000000,\"origin\":\"n1\"}",
        ],
    );
    assert_eq!(
        call(&f, "DELETE", "/limits/edge/k=v", OPS, "").await.0,
        StatusCode::NO_CONTENT
    );
    assert_saved(
        &path,
        &[
            "{\"domain\":\"edge\",\"levels\":[[\"k\",\"v\"]],\"limit\":{\"requests_per_unit\":1,\"unit\":\"minute\"},\"at_us\":1795764309000000,\"origin\":\"n1\"}",
            "{\"domain\":\"edge\",\"levels\":[[\"k\",\"v\"]],\"limit\":null,\"at_us\":1795764309000001,\"origin\":\"n1\"}",
        ],
    );
    task.unwrap().abort();
}

/// What is on disk: the file's lines (none yet here: a change is appended to its journal), then
/// the journal's.
fn assert_saved(path: &Path, lines: &[&str]) {
    let journal = crate::config::runtime::file::journal_path(path);
    let text = [path, journal.as_path()]
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .concat();
    assert_eq!(text.lines().collect::<Vec<_>>(), lines);
}

/// Issue 51: tenants' budgets set at run time (a Tokyo day each), reserved against, and shown
/// with `?budget=true`: one tenant, or a page of them, each with its used and reserved hits,
/// what is left and when it resets.
#[tokio::test]
async fn budgets_show_each_tenants_used_reserved_remaining_and_reset() {
    let f = fixture();
    let body = r#"{"unit":"day","requests_per_unit":10000,"time_zone":"Asia/Tokyo"}"#;
    for t in ["t0", "t1"] {
        let (status, _) = call(&f, "PUT", &format!("/limits/edge/tenant={t}"), OPS, body).await;
        assert_eq!(status, StatusCode::CREATED);
    }
    let reserve = Descriptor {
        entries: vec![
            Entry::new("tenant", "t0"),
            Entry::new(crate::service::RESERVE, "1"),
        ],
        hits_addend: Some(500),
        ..Descriptor::default()
    };
    let request = Request {
        domain: "edge".into(),
        descriptors: vec![reserve],
        ..Request::default()
    };
    for _ in 0..2 {
        f.service.should_rate_limit(request.clone()).await.unwrap();
    }
    let plain = Request {
        descriptors: vec![Descriptor {
            entries: vec![Entry::new("tenant", "t0")],
            hits_addend: Some(70),
            ..Descriptor::default()
        }],
        ..request.clone()
    };
    f.service.should_rate_limit(plain).await.unwrap();
    // 1_795_764_309 is 2026-11-28 07:25:09 UTC, 16:25:09 in Tokyo: 27,291 s to its midnight.
    let budget = |v: &Value| {
        let c = &v["budget"][0];
        let n = |f: &str| c[f].as_u64().unwrap_or(u64::MAX);
        (
            n("used"),
            n("reserved"),
            n("remaining"),
            n("reset_after_secs"),
        )
    };
    let (status, text) = call(&f, "GET", "/limits/edge/tenant=t0?budget=true", OPS, "").await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let one: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(budget(&one), (70, 1000, 8930, 27_291));
    assert_eq!(one["limit"]["time_zone"], "Asia/Tokyo");
    let (_, text) = call(&f, "GET", "/limits/edge?budget=true&limit=1", OPS, "").await;
    let page: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(budget(&page["limits"][0]), (70, 1000, 8930, 27_291));
    assert_eq!(page["next"], "tenant=t0");
    let (_, text) = call(&f, "GET", "/limits/edge?budget&after=tenant%3Dt0", OPS, "").await;
    let page: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(budget(&page["limits"][0]), (0, 0, 10000, 27_291));
    // A page of budgets is at most MAX_BUDGET_PAGE, whatever `limit` asks.
    let (status, _) = call(&f, "GET", "/limits/edge?budget=true&limit=5000", OPS, "").await;
    assert_eq!(status, StatusCode::OK);
    let (status, text) = call(&f, "GET", "/limits/edge?budget=yes", OPS, "").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(message(&text), "budget=yes: expected true or false");
}
