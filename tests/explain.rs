//! `/debug/explain` (what `sluice explain` prints) against what the service then decides: for
//! every way a descriptor matches or fails to (`tests/fixtures/explain/`), the explanation
//! read before each call names the answer the call then gets, call after call until the limits
//! are reached; and the walk says how each level matched.

use sluice_test_support::app::{default_options, fixture, start};
use sluice_test_support::http::http_async;

use serde_json::{Value, json};

/// Requests, each a list of descriptors in the `/forward-auth` form.
const CASES: &[&[&str]] = &[
    &["user=vip"],
    &["user=bob"],
    &["path=/api/v1"],
    &["path=/files/a", "path=/files/b"],
    &["tenant=acme&route=checkout"],
    &["tenant=acme"],
    &["tenant=other&route=checkout"],
    &["plan=free"],
    &["shadow=s"],
    &["ip=10.0.0.1"],
    &["trusted=t", "ip=10.0.0.2"],
    &["quota=q", "user=carol"],
    &["nope=x"],
    &["user=vip", "path=/api/v2", "plan=free"],
    &["inflight=i"],
];

fn query(descriptors: &[&str]) -> String {
    let mut q = String::from("domain=ex");
    for d in descriptors {
        q.push_str("&descriptor=");
        q.push_str(&d.replace('&', "%26"));
    }
    q
}

fn json_request(descriptors: &[&str]) -> String {
    let descriptors: Vec<Value> = descriptors
        .iter()
        .map(|d| {
            let entries: Vec<Value> = d
                .split('&')
                .map(|e| {
                    let (k, v) = e.split_once('=').unwrap();
                    json!({"key": k, "value": v})
                })
                .collect();
            json!({ "entries": entries })
        })
        .collect();
    json!({"domain": "ex", "descriptors": descriptors}).to_string()
}

async fn explain(debug: std::net::SocketAddr, descriptors: &[&str]) -> Value {
    let r = http_async(
        debug,
        "GET",
        &format!("/debug/explain?{}", query(descriptors)),
        "",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    serde_json::from_str(&r.body).unwrap()
}

#[tokio::test]
async fn the_explanation_names_the_answer_the_call_then_gets() {
    let app = start(&fixture("explain"), default_options()).await;
    let mut over = Vec::new();
    for case in CASES {
        for call in 0..6 {
            let e = explain(app.debug, case).await;
            let r = http_async(app.http, "POST", "/json", &json_request(case)).await;
            let answer: Value = serde_json::from_str(&r.body).unwrap();
            let at = format!("{case:?}, call {call}: {e}");
            assert_eq!(e["overall_code"], answer["overallCode"], "{at}");
            if answer["overallCode"] == "OVER_LIMIT" {
                over.push((case[0], call));
            }
            for (i, status) in answer["statuses"].as_array().unwrap().iter().enumerate() {
                assert_eq!(e["descriptors"][i]["code"], status["code"], "{at}");
            }
        }
    }
    // The cases reach their limits at the calls their configs say (shadow mode, unlimited,
    // replaced and unmatched descriptors never do; a quota-mode descriptor alone in its
    // request does not either, beside one that is over it does).
    let first_over = |d: &str| over.iter().find(|(c, _)| *c == d).map(|(_, n)| *n);
    assert_eq!(first_over("user=vip"), Some(5));
    assert_eq!(first_over("user=bob"), Some(2));
    assert_eq!(
        first_over("path=/files/a"),
        Some(1),
        "two values share one counter of 2"
    );
    assert_eq!(first_over("tenant=acme&route=checkout"), Some(2));
    assert_eq!(first_over("plan=free"), Some(3));
    assert_eq!(
        first_over("inflight=i"),
        Some(2),
        "two slots, none given back"
    );
    for never in [
        "shadow=s",
        "trusted=t",
        "nope=x",
        "tenant=acme",
        "tenant=other&route=checkout",
    ] {
        assert_eq!(first_over(never), None, "{never}");
    }
}

#[tokio::test]
async fn the_walk_says_how_each_level_matched_or_why_nothing_did() {
    let app = start(&fixture("explain"), default_options()).await;
    let how = |e: &Value, d: usize, level: usize| e["descriptors"][d]["path"][level]["how"].clone();

    let e = explain(
        app.debug,
        &["user=vip", "user=bob", "path=/api/v1", "path=/files/a"],
    )
    .await;
    assert_eq!(how(&e, 0, 0), "exact");
    assert_eq!(how(&e, 1, 0), "key only");
    assert_eq!(e["descriptors"][1]["limit"]["full_key"], "ex.user");
    assert_eq!(how(&e, 2, 0), "wildcard");
    assert_eq!(e["descriptors"][2]["path"][0]["matched"], "path_/api/*");
    assert_eq!(how(&e, 3, 0), "wildcard, shared");
    assert_eq!(
        e["descriptors"][3]["counters"][0]["key"],
        "ex_path_/files/*_"
    );
    assert_eq!(e["descriptors"][3]["counters"][0]["count"], 0);

    let e = explain(
        app.debug,
        &["tenant=acme&route=x", "tenant=acme", "tenant=zzz"],
    )
    .await;
    assert_eq!(how(&e, 0, 0), "exact");
    assert_eq!(how(&e, 0, 1), "key only");
    assert_eq!(
        e["descriptors"][0]["limit"]["blocks"][0]["algorithm"],
        "token_bucket"
    );
    let why = |d: usize| {
        e["descriptors"][d]["why"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    assert!(why(1).contains("has no rate_limit of its own"), "{e}");
    assert!(
        why(2).contains("nothing at level 1 matches `tenant=zzz`"),
        "{e}"
    );

    let e = explain(app.debug, &["trusted=t", "ip=10.0.0.3", "plan=free"]).await;
    assert_eq!(e["descriptors"][0]["limit"]["unlimited"], true);
    assert_eq!(e["descriptors"][1]["replaced_by"], json!(["ex.trusted"]));
    assert!(e["descriptors"][1].get("counters").is_none(), "{e}");
    let plan = &e["descriptors"][2]["counters"];
    assert_eq!(plan[0]["key"], "ex_plan_free_");
    assert_eq!(plan[1]["key"], "ex_plan_free_#1_");

    // The /json form, posted: a request override skips the config, a descriptor's own
    // hits_addend is what its counters would be charged.
    let body = r#"{"domain":"ex","descriptors":[
        {"entries":[{"key":"user","value":"dan"}],"limit":{"requestsPerUnit":7,"unit":"MINUTE"}},
        {"entries":[{"key":"user","value":"erin"}],"hitsAddend":3}]}"#;
    let r = http_async(app.debug, "POST", "/debug/explain", body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let e: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(
        e["descriptors"][0]["override"],
        json!({"requests_per_unit": 7, "unit": "MINUTE"})
    );
    assert!(e["descriptors"][0].get("path").is_none(), "{e}");
    assert_eq!(e["descriptors"][1]["hits"], 3);
    assert_eq!(
        e["descriptors"][1]["counters"][0]["would_refuse"], true,
        "3 hits of a limit of 2"
    );
    assert_eq!(e["overall_code"], "OVER_LIMIT");
    let bad = http_async(app.debug, "POST", "/debug/explain", "{nope").await;
    assert_eq!(bad.status, 400, "{}", bad.body);

    // A domain nobody loaded answers OK, and says why.
    let r = http_async(
        app.debug,
        "GET",
        "/debug/explain?domain=other&descriptor=a=b",
        "",
    )
    .await;
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(
        (v["domain_loaded"].clone(), v["overall_code"].clone()),
        (json!(false), json!("OK"))
    );
}

/// Every limit of every loadable config fixture (`tests/fixtures/config/`), reached by a
/// request built from its path in the YAML (a key's own value, a wildcard's prefix, or any
/// value for a key-only node): the explanation matches that limit, and names the answer each
/// of four calls then gets.
#[tokio::test]
async fn explain_agrees_with_the_service_on_every_limit_of_the_config_fixtures() {
    let dir = fixture("config");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    let mut checked = 0;
    for file in files {
        let loads = sluice::config::load(
            &sluice::config::ConfigSource::Path(file.clone()),
            &sluice::config::LoadOptions::default(),
            &sluice::config::FileLimits::default(),
        )
        .is_ok();
        if !loads {
            continue;
        }
        let yaml: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        let domain = yaml["domain"].as_str().unwrap_or_default().to_owned();
        let mut paths = Vec::new();
        limit_paths(&yaml["descriptors"], &mut Vec::new(), &mut paths);
        let app = start(&file, default_options()).await;
        for entries in paths {
            let descriptor = entries
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join("&");
            let q = format!(
                "domain={domain}&descriptor={}",
                descriptor.replace('&', "%26")
            );
            let request = json!({"domain": domain, "descriptors": [{"entries": entries
                .iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>()}]})
            .to_string();
            for call in 0..4 {
                let r = http_async(app.debug, "GET", &format!("/debug/explain?{q}"), "").await;
                let e: Value = serde_json::from_str(&r.body).unwrap();
                let at = format!("{}: {descriptor}, call {call}: {e}", file.display());
                assert!(e["descriptors"][0].get("limit").is_some(), "{at}");
                let answer: Value = serde_json::from_str(
                    &http_async(app.http, "POST", "/json", &request).await.body,
                )
                .unwrap();
                assert_eq!(e["overall_code"], answer["overallCode"], "{at}");
                assert_eq!(
                    e["descriptors"][0]["code"], answer["statuses"][0]["code"],
                    "{at}"
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 20, "only {checked} limits checked");
}

/// The entries of a request reaching each node with a limit below `nodes` (`path` holds the
/// levels above).
fn limit_paths(
    nodes: &serde_yaml_ng::Value,
    path: &mut Vec<(String, String)>,
    out: &mut Vec<Vec<(String, String)>>,
) {
    for node in nodes.as_sequence().into_iter().flatten() {
        let key = match &node["key"] {
            serde_yaml_ng::Value::String(s) => s.clone(),
            other => serde_yaml_ng::to_string(other).unwrap().trim().to_owned(),
        };
        let value = match &node["value"] {
            serde_yaml_ng::Value::Null => "any-value".to_owned(),
            serde_yaml_ng::Value::String(s) => s.replace('*', "x"),
            other => serde_yaml_ng::to_string(other).unwrap().trim().to_owned(),
        };
        path.push((key, value));
        let limited = !node["rate_limit"].is_null() || !node["rate_limits"].is_null();
        if limited {
            out.push(path.clone());
        }
        limit_paths(&node["descriptors"], path, out);
        path.pop();
    }
}
