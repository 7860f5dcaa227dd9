//! The request `/debug/explain` and `/debug/counters` take, in either form, decoded as the
//! debug port decodes it. `sluice explain` sends it, or decodes it here itself to explain
//! against a config file.

use axum::http::HeaderMap;

use crate::api::bad_request::BadRequest;
use crate::api::body::BodyError;
use crate::descriptor::Request;

/// A request to explain: in the query form of `/forward-auth`, or a `/json` body.
pub enum Asked {
    Query(String),
    Json(String),
}

/// The request `asked` as the service's, decoded as the debug port decodes it: a body over
/// `max_bytes` (SLUICE_MAX_REQUEST_BYTES) is refused as [`crate::api::body::read`] refuses it.
pub(crate) fn decode(asked: &Asked, max_bytes: usize) -> Result<Request, BadRequest> {
    match asked {
        Asked::Query(q) => query(Some(q), max_bytes),
        Asked::Json(body) if body.len() > max_bytes => {
            Err(BodyError::TooLarge { max_bytes }.into())
        }
        Asked::Json(body) => crate::api::json::request(body.as_bytes()),
    }
}

/// The request in a `/debug/*` query string: the `/forward-auth` query form, with no
/// `X-Sluice-*` headers to fall back on.
pub(crate) fn query(query: Option<&str>, max_bytes: usize) -> Result<Request, BadRequest> {
    let query = Some(query.unwrap_or_default());
    let (request, _deny) =
        crate::api::forward_auth::forward_auth_request(query, &HeaderMap::new(), max_bytes)?;
    Ok(request)
}
