//! The request `/debug/explain` and `/debug/counters` take, in either form, decoded as the
//! debug port decodes it. `sluice explain` sends it, or decodes it here itself to explain
//! against a config file.

/// A request to explain: in the query form of `/forward-auth`, or a `/json` body.
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
