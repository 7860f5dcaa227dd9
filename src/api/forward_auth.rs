//! The nginx `auth_request` adapter on PORT: `/nginx`, any method, no body.
//!
//! nginx has no ratelimit.v3 client; its `auth_request` module sends a subrequest and only
//! understands 2xx (allow), 401 and 403 (deny); any other status becomes a 500 for the client.
//! So the decision is read from the subrequest's headers and answered in those terms:
//!
//! | Header | Meaning |
//! |---|---|
//! | `X-Sluice-Domain` (one, required) | the domain, percent-decoded |
//! | `X-Sluice-Descriptor` (one or more, required) | descriptors, see below |
//! | `X-Sluice-Hits-Addend` (optional) | the request-level hits addend (u32; 0 means 1) |
//!
//! A descriptor is `key=value` entries joined by `&`, like a query string; keys and values are
//! percent-decoded (`%2C` for `,`, `%26` for `&`, `%25` for `%`; `+` is a plus, not a space).
//! A value `@Header-Name` is instead the raw value of that header of the subrequest, which
//! nginx copies from the client's request: this is Envoy's `request_headers` action, and the
//! safe way to pass client-controlled text (an API key, a path), which core nginx cannot
//! percent-encode. If the named header is absent the whole descriptor is left out, as Envoy
//! does; a literal value starting with `@` is written `%40`.
//!
//! Descriptors are separated by `,` or by repeating the header. Both are the same thing in
//! HTTP (RFC 9110, section 5.3: repeated field lines may be joined with commas), so a proxy
//! that joins them cannot merge two descriptors into one.
//!
//! The bytes these headers carry, with the client header values `@Header-Name` copies in, are
//! capped at SLUICE_MAX_REQUEST_BYTES, the cap of a `/json` body or a gRPC message: measured
//! before anything is parsed, and each copy before it is made.
//!
//! Answers:
//! - 200 when allowed, with `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset`
//!   (seconds) when a limit matched, describing the status gRPC and `/json` describe
//!   ([`crate::service::RateLimitHeaders::describing`]);
//! - 403 when over the limit, with the same headers and `Retry-After` (seconds), so nginx's
//!   `auth_request_set` can copy them and `error_page 403 = @limited` can answer 429;
//! - 400 with a plain-text reason for missing, malformed or oversized headers, or a request
//!   beyond Sluice's caps (nginx shows it as 500);
//! - 500 with a plain-text reason when the service cannot decide (no config loaded, a full
//!   store). Fail-open versus fail-closed is nginx's choice, not made here: nginx answers 500
//!   by default (closed), and `error_page 500 = @fallback` can send the request on (open).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;

use crate::descriptor::{Descriptor, Entry, Request};
use crate::percent::decode;
use crate::service::{Code, RateLimitService};
use crate::store::CounterStore;

pub const DOMAIN_HEADER: &str = "x-sluice-domain";
pub const DESCRIPTOR_HEADER: &str = "x-sluice-descriptor";
pub const HITS_ADDEND_HEADER: &str = "x-sluice-hits-addend";

/// The headers' names in answers; fixed (not LIMIT_*_HEADER) because nginx configs refer to
/// them as `$upstream_http_ratelimit_limit` and so on.
pub const LIMIT: &str = "ratelimit-limit";
pub const REMAINING: &str = "ratelimit-remaining";
pub const RESET: &str = "ratelimit-reset";

/// A subrequest whose headers do not make a request. Answered 400.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum HeaderError {
    #[error("missing X-Sluice-Domain header")]
    MissingDomain,
    #[error("more than one X-Sluice-Domain header")]
    SeveralDomains,
    #[error("missing X-Sluice-Descriptor header")]
    MissingDescriptor,
    #[error("X-Sluice-Descriptor: descriptor {index} has an empty entry")]
    EmptyEntry { index: usize },
    #[error("X-Sluice-Descriptor: descriptor {index}: entry {entry:?} is not key=value")]
    NoEquals { index: usize, entry: String },
    #[error("X-Sluice-Descriptor: descriptor {index}: entry {entry:?} has an empty key")]
    EmptyKey { index: usize, entry: String },
    #[error("X-Sluice-Descriptor: descriptor {index}: {header:?} is not a header name")]
    BadHeaderName { index: usize, header: String },
    #[error("{header}: {text:?} is not valid percent-encoded UTF-8")]
    BadEncoding { header: &'static str, text: String },
    #[error("X-Sluice-Hits-Addend: {0:?} is not a number from 0 to 4294967295")]
    BadHitsAddend(String),
    #[error("more than one X-Sluice-Hits-Addend header")]
    SeveralHitsAddends,
    #[error(
        "the X-Sluice-* headers and the client headers they name are over {max} bytes (SLUICE_MAX_REQUEST_BYTES)"
    )]
    TooLarge { max: usize },
}

/// The bytes a subrequest's descriptors are decoded from, held to a cap as they are counted.
struct Budget {
    used: usize,
    max: usize,
}

impl Budget {
    fn take(&mut self, bytes: usize) -> Result<(), HeaderError> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.max {
            return Err(HeaderError::TooLarge { max: self.max });
        }
        Ok(())
    }
}

/// Decodes the subrequest's headers, refusing them when they carry more than `max_bytes`
/// (SLUICE_MAX_REQUEST_BYTES). The descriptor list is empty (and the request is simply allowed)
/// when every descriptor referred to an absent header.
pub fn request_from_headers(headers: &HeaderMap, max_bytes: usize) -> Result<Request, HeaderError> {
    // Sluice's own headers are measured before any is parsed; the client headers that
    // `@Header-Name` copies are measured as they are copied.
    let mut budget = Budget {
        used: 0,
        max: max_bytes,
    };
    for name in [DOMAIN_HEADER, DESCRIPTOR_HEADER, HITS_ADDEND_HEADER] {
        for value in headers.get_all(name) {
            budget.take(value.len())?;
        }
    }
    let mut domains = headers.get_all(DOMAIN_HEADER).iter();
    let domain = match (domains.next(), domains.next()) {
        (None, _) => return Err(HeaderError::MissingDomain),
        (Some(_), Some(_)) => return Err(HeaderError::SeveralDomains),
        (Some(v), None) => {
            let v = trim(v.as_bytes());
            decode(v).ok_or_else(|| bad_encoding("X-Sluice-Domain", v))?
        }
    };
    if domain.is_empty() {
        return Err(HeaderError::MissingDomain);
    }

    let mut descriptors = Vec::new();
    let mut index = 0;
    let mut any = false;
    for value in headers.get_all(DESCRIPTOR_HEADER) {
        for item in value.as_bytes().split(|b| *b == b',') {
            let item = trim(item);
            // Empty list elements are allowed and ignored (RFC 9110, section 5.6.1).
            if item.is_empty() {
                continue;
            }
            any = true;
            if let Some(d) = descriptor(item, index, headers, &mut budget)? {
                descriptors.push(d);
            }
            index += 1;
        }
    }
    if !any {
        return Err(HeaderError::MissingDescriptor);
    }

    let mut addends = headers.get_all(HITS_ADDEND_HEADER).iter();
    let hits_addend = match (addends.next(), addends.next()) {
        (None, _) => 0,
        (Some(_), Some(_)) => return Err(HeaderError::SeveralHitsAddends),
        (Some(v), None) => {
            let text = String::from_utf8_lossy(trim(v.as_bytes()));
            if text.is_empty() {
                0
            } else {
                text.parse()
                    .map_err(|_| HeaderError::BadHitsAddend(text.into_owned()))?
            }
        }
    };

    Ok(Request {
        domain,
        descriptors,
        hits_addend,
    })
}

/// One descriptor; `None` when it refers to an absent header.
fn descriptor(
    item: &[u8],
    index: usize,
    headers: &HeaderMap,
    budget: &mut Budget,
) -> Result<Option<Descriptor>, HeaderError> {
    let mut entries = Vec::new();
    for entry in item.split(|b| *b == b'&') {
        let entry = trim(entry);
        if entry.is_empty() {
            return Err(HeaderError::EmptyEntry { index });
        }
        let lossy = || String::from_utf8_lossy(entry).into_owned();
        let Some(eq) = entry.iter().position(|b| *b == b'=') else {
            return Err(HeaderError::NoEquals {
                index,
                entry: lossy(),
            });
        };
        let (key, value) = (&entry[..eq], &entry[eq + 1..]);
        if key.is_empty() {
            return Err(HeaderError::EmptyKey {
                index,
                entry: lossy(),
            });
        }
        let bad = || bad_encoding("X-Sluice-Descriptor", entry);
        let key = decode(key).ok_or_else(bad)?;
        let value = match value.strip_prefix(b"@") {
            Some(name) => {
                let name =
                    HeaderName::from_bytes(name).map_err(|_| HeaderError::BadHeaderName {
                        index,
                        header: String::from_utf8_lossy(name).into_owned(),
                    })?;
                let values = headers.get_all(&name);
                let mut iter = values.iter();
                let Some(first) = iter.next() else {
                    return Ok(None);
                };
                // Each copy counts: a header named by several entries is copied into each.
                let joined = values.iter().map(|v| v.len() + 1).sum::<usize>() - 1;
                budget.take(joined)?;
                // Client-controlled bytes: never an error (that would be a 500 the client
                // chose), at worst a lossy key that only shares the client's own counter.
                let mut value = String::from_utf8_lossy(first.as_bytes()).into_owned();
                for more in iter {
                    value.push(',');
                    value.push_str(&String::from_utf8_lossy(more.as_bytes()));
                }
                value
            }
            None => decode(value).ok_or_else(bad)?,
        };
        entries.push(Entry { key, value });
    }
    Ok(Some(Descriptor {
        entries,
        limit_override: None,
        hits_addend: None,
    }))
}

fn trim(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &bytes[start..end]
}

fn bad_encoding(header: &'static str, text: &[u8]) -> HeaderError {
    HeaderError::BadEncoding {
        header,
        text: String::from_utf8_lossy(text).into_owned(),
    }
}

fn text(status: StatusCode, reason: impl std::fmt::Display) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{reason}\n"),
    )
        .into_response()
}

/// Decides one subrequest. Not tied to axum's extractors, so tests call it directly.
pub async fn check<S: CounterStore>(
    service: &RateLimitService<S>,
    headers: &HeaderMap,
    max_bytes: usize,
) -> Response {
    let request = match request_from_headers(headers, max_bytes) {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(error = %e, "nginx: bad subrequest headers");
            return text(StatusCode::BAD_REQUEST, e);
        }
    };
    // Every descriptor named an absent header: nothing to count, as Envoy does not call.
    if request.descriptors.is_empty() {
        return StatusCode::OK.into_response();
    }
    let trace = super::trace_context(
        service.observer().traces(),
        crate::telemetry::otlp::Transport::Nginx,
        headers,
    );
    let response = match service.should_rate_limit_traced(request, &trace).await {
        Ok(r) => r,
        // Requests beyond Sluice's caps are the config's mistake (400); anything else means
        // Sluice cannot decide (500), and nginx's config decides whether that fails open.
        Err(e) if e.is_invalid_argument() => return text(StatusCode::BAD_REQUEST, e),
        Err(e) => {
            // Per request, so not at the default level: the service already logs backend
            // failures (rate-limited) and a missing config is logged when it happens.
            tracing::debug!(error = %e, "nginx: no decision");
            return text(StatusCode::INTERNAL_SERVER_ERROR, e);
        }
    };
    let (status, reason) = match response.overall_code {
        Code::Ok => (StatusCode::OK, "OK"),
        Code::OverLimit => (StatusCode::FORBIDDEN, "OVER_LIMIT"),
    };
    let mut answer = text(status, reason);
    // The service's one header rule (the status gRPC and `/json` describe too).
    if let Some(rl) = response.rate_limit {
        let h = answer.headers_mut();
        h.insert(LIMIT, HeaderValue::from(rl.limit));
        h.insert(REMAINING, HeaderValue::from(rl.remaining));
        h.insert(RESET, HeaderValue::from(rl.reset_secs));
        if response.overall_code == Code::OverLimit {
            h.insert(header::RETRY_AFTER, HeaderValue::from(rl.reset_secs));
        }
    }
    crate::service::recycle_statuses(response.statuses);
    answer
}

/// The `/nginx` route, merged into PORT's router; `max_bytes` is SLUICE_MAX_REQUEST_BYTES.
pub fn router<S: CounterStore>(service: Arc<RateLimitService<S>>, max_bytes: usize) -> Router {
    Router::new()
        .route(
            "/nginx",
            any(
                move |State(service): State<Arc<RateLimitService<S>>>, headers: HeaderMap| async move {
                    check(&service, &headers, max_bytes).await
                },
            ),
        )
        .with_state(service)
}

#[cfg(test)]
mod tests;
