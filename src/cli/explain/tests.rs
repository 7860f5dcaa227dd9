use super::*;
use crate::cli::test_server::{Reply, serve};

#[test]
fn the_query_keeps_entries_together_and_encodes_the_rest() {
    let q = query("edge", &["k=v&k2=a b".into(), "x=%".into()], 3);
    assert_eq!(
        q,
        "domain=edge&descriptor=k=v%26k2=a%20b&descriptor=x=%25&hits_addend=3"
    );
}

/// A debug port behind a proxy that re-frames answers in chunks: the JSON is read whole (the
/// client before hyper's read the chunk sizes as part of the body, and found no JSON).
#[test]
fn a_chunked_explanation_is_read_whole() {
    let json = r#"{"domain":"ex","descriptors":[],"overall_code":"OK"}"#;
    let (a, b) = json.split_at(20);
    let mut server = serve(vec![Reply::chunked(200, &[a, b])]);
    let asked = Asked::Query(query("ex", &["user=bob".into()], 0));
    let v = fetch(&server.addr, &asked, http::LIMITS).unwrap();
    assert_eq!(v, serde_json::from_str::<Value>(json).unwrap());
    assert_eq!(super::super::render::render(&v), "domain ex\noverall: OK\n");
    let requests = server.requests();
    assert!(
        requests[0].starts_with("GET /debug/explain?domain=ex&descriptor=user=bob HTTP/1.1\r\n"),
        "{requests:?}"
    );
}

#[test]
fn a_json_request_is_posted_and_a_refusal_is_named() {
    let body = r#"{"domain":"ex"}"#;
    let mut server = serve(vec![Reply::length(400, "no descriptors\n")]);
    let err = fetch(&server.addr, &Asked::Json(body.into()), http::LIMITS).unwrap_err();
    assert_eq!(err, format!("{} answered 400: no descriptors", server.addr));
    let requests = server.requests();
    assert!(requests[0].starts_with("POST /debug/explain HTTP/1.1\r\n"));
    assert!(requests[0].ends_with(body), "{requests:?}");
}
