//! The HTTP auth-subrequest adapters on PORT, for proxies that ask an external service before
//! letting a request through: `/nginx` (nginx's `auth_request`) and `/forward-auth` (Traefik's
//! `ForwardAuth`, Caddy's `forward_auth`, APISIX's `forward-auth`, Kong and the like). Any
//! method, no body.
//!
//! The request is read from the subrequest's headers, Sluice's own or the query string of the
//! address the proxy calls:
//!
//! | Header | Query parameter (`/forward-auth`) | Meaning |
//! |---|---|---|
//! | `X-Sluice-Domain` (one, required) | `domain` | the domain, percent-decoded |
//! | `X-Sluice-Descriptor` (one or more, required) | `descriptor` (repeatable) | descriptors, see below |
//! | `X-Sluice-Hits-Addend` (optional) | `hits_addend` | the request-level hits addend (u32; 0 means 1) |
//! | `X-Sluice-Negative-Hits` (optional) | `negative_hits` | `true` (or `1`): every descriptor is a refund, its hits taken off (`is_negative_hits`); `false`, `0` or empty: a charge |
//! | - | `deny_status` | the status of a refusal on `/forward-auth`, 400 to 599; 429 by default |
//!
//! A refund is what a proxy sends at a request's end to count requests in flight (nginx's
//! `post_action`): the same domain and descriptors as the check, with `negative_hits`. A proxy
//! that sets the `X-Sluice-*` headers must set `X-Sluice-Negative-Hits` too (empty on the
//! check), as it does `X-Sluice-Hits-Addend`, or a client could turn its own check into a
//! refund.
//!
//! A descriptor is `key=value` entries joined by `&`, like a query string; keys and values are
//! percent-decoded (`%2C` for `,`, `%26` for `&`, `%25` for `%`; `+` is a plus, not a space).
//! A value `@Header-Name` is instead the raw value of that header of the subrequest, which the
//! proxy copies from the client's request: this is Envoy's `request_headers` action, and the
//! safe way to pass client-controlled text (an API key, a path), which a proxy's config cannot
//! percent-encode. `@Header-Name:first` and `@Header-Name:last` take the first or the last
//! comma-separated element of it (`X-Forwarded-For`'s first or last hop). If the named header
//! is absent the whole descriptor is left out, as Envoy does; a literal value starting with `@`
//! is written `%40`.
//!
//! Descriptors are separated by `,` or by repeating the header. Both are the same thing in
//! HTTP (RFC 9110, section 5.3: repeated field lines may be joined with commas), so a proxy
//! that joins them cannot merge two descriptors into one.
//!
//! **The query form**, for proxies that call a fixed address and pass the client's headers on
//! (Traefik cannot add headers to its auth request; Caddy and nginx pass every client header):
//! when `/forward-auth`'s query string has `domain`, the request comes from the query string
//! alone and any `X-Sluice-*` header is ignored, so a client cannot choose its domain or add a
//! descriptor by sending one. A parameter's value, percent-decoded once, is the header's
//! syntax: `?domain=edge&descriptor=api_key=@X-Api-Key&descriptor=route=api%26method=GET`
//! (`%26` joins two entries of one descriptor; a literal `%` in a value is `%2525`). An unknown
//! parameter is refused, so a typo in the proxy's config shows on the first request.
//!
//! The bytes these fields carry, with the client header values `@Header-Name` copies in, are
//! capped at SLUICE_MAX_REQUEST_BYTES, the cap of a `/json` body or a gRPC message: measured
//! before anything is parsed, and each copy before it is made.
//!
//! Answers:
//! - 200 when allowed, with `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset`
//!   (seconds) when a limit matched, describing the status gRPC and `/json` describe
//!   ([`crate::service::RateLimitHeaders::describing`]), and with LIMIT_REQUEST_HEADERS_ENABLED
//!   the same numbers under LIMIT_REQUEST_*_HEADER's names, for the proxy to copy onto the
//!   request it sends on (gRPC's `request_headers_to_add`);
//! - when over the limit, 403 on `/nginx` (nginx's `auth_request` understands only 2xx, 401
//!   and 403, so `error_page 403 = @limited` answers 429) and `deny_status` (429) on
//!   `/forward-auth` (Traefik and Caddy hand the answer to the client as it is), with the same
//!   headers and `Retry-After` (seconds);
//! - 400 with a plain-text reason for missing, malformed or oversized fields, or a request
//!   beyond Sluice's caps (nginx shows it as 500);
//! - 500 with a plain-text reason when the service cannot decide (no config loaded, a full
//!   store). Fail-open versus fail-closed is the proxy's choice, not made here: nginx answers
//!   500 by default (closed), and `error_page 500 = @fallback` can send the request on (open);
//!   Traefik and Caddy pass the 500 on (closed).

use std::borrow::Cow;
use std::sync::Arc;

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;

use super::bad_request::BadRequest;
use crate::descriptor::{Descriptor, Entry, Request};
use crate::percent::decode;
use crate::service::{Code, RateLimitService};
use crate::store::CounterStore;
use crate::telemetry::otlp::Transport;

pub const DOMAIN_HEADER: &str = "x-sluice-domain";
pub const DESCRIPTOR_HEADER: &str = "x-sluice-descriptor";
pub const HITS_ADDEND_HEADER: &str = "x-sluice-hits-addend";
pub(crate) const NEGATIVE_HITS_HEADER: &str = "x-sluice-negative-hits";

/// The headers' names in answers; fixed (not LIMIT_*_HEADER) because nginx configs refer to
/// them as `$upstream_http_ratelimit_limit` and so on.
pub const LIMIT: &str = "ratelimit-limit";
pub const REMAINING: &str = "ratelimit-remaining";
pub const RESET: &str = "ratelimit-reset";

/// `/forward-auth`'s refusal unless its query string says otherwise: Too Many Requests, which
/// Traefik and Caddy pass to the client as it is.
pub(crate) const FORWARD_AUTH_DENY: StatusCode = StatusCode::TOO_MANY_REQUESTS;

/// Where a subrequest's own fields were read from; errors name the field as it was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// The `X-Sluice-*` headers.
    Headers,
    /// `/forward-auth`'s query string.
    Query,
}

impl Form {
    /// The domain field, as errors name it.
    pub fn domain(self) -> &'static str {
        match self {
            Form::Headers => "X-Sluice-Domain",
            Form::Query => "query parameter domain",
        }
    }
    pub fn descriptor(self) -> &'static str {
        match self {
            Form::Headers => "X-Sluice-Descriptor",
            Form::Query => "query parameter descriptor",
        }
    }
    pub fn hits_addend(self) -> &'static str {
        match self {
            Form::Headers => "X-Sluice-Hits-Addend",
            Form::Query => "query parameter hits_addend",
        }
    }
    pub fn negative_hits(self) -> &'static str {
        match self {
            Form::Headers => "X-Sluice-Negative-Hits",
            Form::Query => "query parameter negative_hits",
        }
    }
    /// What a field is, after its name ("X-Sluice-Domain header").
    fn kind(self) -> &'static str {
        match self {
            Form::Headers => " header",
            Form::Query => "",
        }
    }
    fn all(self) -> &'static str {
        match self {
            Form::Headers => "the X-Sluice-* headers",
            Form::Query => "the query string",
        }
    }
}

/// A subrequest whose headers or query string do not make a request. Answered 400.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum HeaderError {
    #[error("missing {}{}", .0.domain(), .0.kind())]
    MissingDomain(Form),
    #[error("more than one {}{}", .0.domain(), .0.kind())]
    SeveralDomains(Form),
    #[error("missing {}{}", .0.descriptor(), .0.kind())]
    MissingDescriptor(Form),
    #[error("{}: descriptor {index} has an empty entry", .form.descriptor())]
    EmptyEntry { form: Form, index: usize },
    #[error("{}: descriptor {index}: entry {entry:?} is not key=value", .form.descriptor())]
    NoEquals {
        form: Form,
        index: usize,
        entry: String,
    },
    #[error("{}: descriptor {index}: entry {entry:?} has an empty key", .form.descriptor())]
    EmptyKey {
        form: Form,
        index: usize,
        entry: String,
    },
    #[error(
        "{}: descriptor {index}: {header:?} is not a header name, optionally followed by :first or :last",
        .form.descriptor()
    )]
    BadHeaderName {
        form: Form,
        index: usize,
        header: String,
    },
    #[error("{field}: {text:?} is not valid percent-encoded UTF-8")]
    BadEncoding { field: &'static str, text: String },
    #[error("{}: {text:?} is not a number from 0 to 4294967295", .form.hits_addend())]
    BadHitsAddend { form: Form, text: String },
    #[error("more than one {}{}", .0.hits_addend(), .0.kind())]
    SeveralHitsAddends(Form),
    #[error("{}: {text:?} is not true, false, 1, 0 or empty", .form.negative_hits())]
    BadNegativeHits { form: Form, text: String },
    #[error("more than one {}{}", .0.negative_hits(), .0.kind())]
    SeveralNegativeHits(Form),
    #[error("query parameter deny_status: {0:?} is not a status from 400 to 599")]
    BadDenyStatus(String),
    #[error("more than one query parameter deny_status")]
    SeveralDenyStatuses,
    #[error(
        "unknown query parameter {0:?} (domain, descriptor, hits_addend, negative_hits and deny_status are known)"
    )]
    UnknownParameter(String),
    #[error(
        "query parameter {0} without domain: give the domain in the query string too, or every field in X-Sluice-* headers"
    )]
    NoQueryDomain(&'static str),
    #[error(
        "{} and the client headers they name are over {max} bytes (SLUICE_MAX_REQUEST_BYTES)",
        .form.all()
    )]
    TooLarge { form: Form, max: usize },
}

impl From<HeaderError> for BadRequest {
    fn from(e: HeaderError) -> Self {
        BadRequest::invalid(e)
    }
}

/// The bytes a subrequest's descriptors are decoded from, held to a cap as they are counted.
struct Budget {
    form: Form,
    used: usize,
    max: usize,
}

impl Budget {
    fn take(&mut self, bytes: usize) -> Result<(), HeaderError> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.max {
            let (form, max) = (self.form, self.max);
            return Err(HeaderError::TooLarge { form, max });
        }
        Ok(())
    }
}

/// A subrequest's own fields, unparsed: the values of Sluice's headers, or of the query
/// parameters once percent-decoded.
struct Fields<'a> {
    form: Form,
    domains: Vec<Cow<'a, [u8]>>,
    descriptors: Vec<Cow<'a, [u8]>>,
    hits_addends: Vec<Cow<'a, [u8]>>,
    negative_hits: Vec<Cow<'a, [u8]>>,
}

impl<'a> Fields<'a> {
    fn from_headers(headers: &'a HeaderMap) -> Self {
        let values = |name| {
            headers
                .get_all(name)
                .iter()
                .map(|v| Cow::Borrowed(v.as_bytes()))
                .collect()
        };
        Fields {
            form: Form::Headers,
            domains: values(DOMAIN_HEADER),
            descriptors: values(DESCRIPTOR_HEADER),
            hits_addends: values(HITS_ADDEND_HEADER),
            negative_hits: values(NEGATIVE_HITS_HEADER),
        }
    }
}

/// `/forward-auth`'s query string: its fields when it has `domain` (else the request is in
/// the headers), and the deny status it asks for.
struct Query {
    fields: Option<Fields<'static>>,
    deny_status: StatusCode,
}

impl Query {
    /// Parses `query`, which the caller has measured against the byte cap.
    fn parse(query: &str) -> Result<Query, HeaderError> {
        let mut fields = Fields {
            form: Form::Query,
            domains: Vec::new(),
            descriptors: Vec::new(),
            hits_addends: Vec::new(),
            negative_hits: Vec::new(),
        };
        let mut deny = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let (list, field) = match name {
                "domain" => (&mut fields.domains, Form::Query.domain()),
                "descriptor" => (&mut fields.descriptors, Form::Query.descriptor()),
                "hits_addend" => (&mut fields.hits_addends, Form::Query.hits_addend()),
                "negative_hits" => (&mut fields.negative_hits, Form::Query.negative_hits()),
                "deny_status" => (&mut deny, "query parameter deny_status"),
                _ => return Err(HeaderError::UnknownParameter(lossy(name.as_bytes()))),
            };
            let value = decode(value.as_bytes()).ok_or_else(|| HeaderError::BadEncoding {
                field,
                text: value.to_owned(),
            })?;
            list.push(Cow::Owned(value.into_bytes()));
        }
        let deny_status = match deny.as_slice() {
            [] => FORWARD_AUTH_DENY,
            [status] => deny_status(status)?,
            _ => return Err(HeaderError::SeveralDenyStatuses),
        };
        if fields.domains.is_empty() {
            if !fields.descriptors.is_empty() {
                return Err(HeaderError::NoQueryDomain("descriptor"));
            }
            if !fields.hits_addends.is_empty() {
                return Err(HeaderError::NoQueryDomain("hits_addend"));
            }
            if !fields.negative_hits.is_empty() {
                return Err(HeaderError::NoQueryDomain("negative_hits"));
            }
            return Ok(Query {
                fields: None,
                deny_status,
            });
        }
        Ok(Query {
            fields: Some(fields),
            deny_status,
        })
    }
}

fn deny_status(text: &[u8]) -> Result<StatusCode, HeaderError> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.trim().parse::<u16>().ok())
        .filter(|code| (400..=599).contains(code))
        .and_then(|code| StatusCode::from_u16(code).ok())
        .ok_or_else(|| HeaderError::BadDenyStatus(lossy(text)))
}

/// Decodes an `auth_request` subrequest's `X-Sluice-*` headers, refusing them when they carry
/// more than `max_bytes` (SLUICE_MAX_REQUEST_BYTES). The descriptor list is empty (and the
/// request is simply allowed) when every descriptor referred to an absent header.
pub fn request_from_headers(headers: &HeaderMap, max_bytes: usize) -> Result<Request, HeaderError> {
    request_from(Fields::from_headers(headers), headers, max_bytes, 0)
}

/// Decodes a `/forward-auth` subrequest: from its query string when that has `domain`, else
/// from its `X-Sluice-*` headers; with the status a refusal answers.
pub fn forward_auth_request(
    query: Option<&str>,
    headers: &HeaderMap,
    max_bytes: usize,
) -> Result<(Request, StatusCode), HeaderError> {
    let query = query.unwrap_or_default();
    // The query string is counted whole, before it is parsed, as the headers are.
    if query.len() > max_bytes {
        let form = Form::Query;
        return Err(HeaderError::TooLarge {
            form,
            max: max_bytes,
        });
    }
    let parsed = Query::parse(query)?;
    let request = match parsed.fields {
        Some(fields) => request_from(fields, headers, max_bytes, query.len())?,
        None => request_from_headers(headers, max_bytes)?,
    };
    Ok((request, parsed.deny_status))
}

/// The request `fields` make, `@Header` values read from `headers`; `used` bytes of the cap
/// are already spent (the query string).
fn request_from(
    fields: Fields<'_>,
    headers: &HeaderMap,
    max_bytes: usize,
    used: usize,
) -> Result<Request, HeaderError> {
    let form = fields.form;
    // Sluice's own fields are measured before any is parsed; the client headers that
    // `@Header-Name` copies are measured as they are copied.
    let mut budget = Budget {
        form,
        used,
        max: max_bytes,
    };
    if form == Form::Headers {
        let lists = [
            &fields.domains,
            &fields.descriptors,
            &fields.hits_addends,
            &fields.negative_hits,
        ];
        for list in lists {
            for value in list {
                budget.take(value.len())?;
            }
        }
    }
    let domain = domain_of(&fields)?;

    let mut descriptors = Vec::new();
    let mut index = 0;
    let mut any = false;
    for value in &fields.descriptors {
        for item in value.split(|b| *b == b',') {
            let item = trim(item);
            // Empty list elements are allowed and ignored (RFC 9110, section 5.6.1).
            if item.is_empty() {
                continue;
            }
            any = true;
            let at = Place { form, index };
            if let Some(d) = descriptor(item, at, headers, &mut budget)? {
                descriptors.push(d);
            }
            index += 1;
        }
    }
    if !any {
        return Err(HeaderError::MissingDescriptor(form));
    }

    let hits_addend = hits_addend_of(&fields)?;
    if negative_hits(&fields)? {
        for d in &mut descriptors {
            d.negative_hits = true;
        }
    }

    Ok(Request {
        domain,
        descriptors,
        hits_addend,
    })
}

/// The one domain `fields` name, decoded and not empty.
fn domain_of(fields: &Fields<'_>) -> Result<String, HeaderError> {
    let form = fields.form;
    let domain = match fields.domains.as_slice() {
        [] => return Err(HeaderError::MissingDomain(form)),
        [v] => {
            let v = trim(v);
            decode(v).ok_or_else(|| bad_encoding(form.domain(), v))?
        }
        _ => return Err(HeaderError::SeveralDomains(form)),
    };
    if domain.is_empty() {
        return Err(HeaderError::MissingDomain(form));
    }
    Ok(domain)
}

/// The request's `hits_addend`: 0 when absent or empty.
fn hits_addend_of(fields: &Fields<'_>) -> Result<u32, HeaderError> {
    let form = fields.form;
    match fields.hits_addends.as_slice() {
        [] => Ok(0),
        [v] => {
            let text = String::from_utf8_lossy(trim(v));
            if text.is_empty() {
                return Ok(0);
            }
            text.parse().map_err(|_| HeaderError::BadHitsAddend {
                form,
                text: text.into_owned(),
            })
        }
        _ => Err(HeaderError::SeveralHitsAddends(form)),
    }
}

/// Whether the request is a refund: `true` or `1` (any case); `false`, `0`, empty or absent is
/// a charge.
fn negative_hits(fields: &Fields<'_>) -> Result<bool, HeaderError> {
    let form = fields.form;
    let [v] = fields.negative_hits.as_slice() else {
        return match fields.negative_hits.len() {
            0 => Ok(false),
            _ => Err(HeaderError::SeveralNegativeHits(form)),
        };
    };
    let text = String::from_utf8_lossy(trim(v));
    match text.to_ascii_lowercase().as_str() {
        "true" | "1" => Ok(true),
        "false" | "0" | "" => Ok(false),
        _ => Err(HeaderError::BadNegativeHits {
            form,
            text: text.into_owned(),
        }),
    }
}

/// Which descriptor of which form is being parsed, for errors.
#[derive(Clone, Copy)]
struct Place {
    form: Form,
    index: usize,
}

/// One descriptor; `None` when it refers to an absent header.
fn descriptor(
    item: &[u8],
    at: Place,
    headers: &HeaderMap,
    budget: &mut Budget,
) -> Result<Option<Descriptor>, HeaderError> {
    let Place { form, index } = at;
    let mut entries = Vec::new();
    for entry in item.split(|b| *b == b'&') {
        let entry = trim(entry);
        if entry.is_empty() {
            return Err(HeaderError::EmptyEntry { form, index });
        }
        let Some(eq) = entry.iter().position(|b| *b == b'=') else {
            let entry = lossy(entry);
            return Err(HeaderError::NoEquals { form, index, entry });
        };
        let (key, value) = (&entry[..eq], &entry[eq + 1..]);
        if key.is_empty() {
            let entry = lossy(entry);
            return Err(HeaderError::EmptyKey { form, index, entry });
        }
        let bad = || bad_encoding(form.descriptor(), entry);
        let key = decode(key).ok_or_else(bad)?;
        let value = match value.strip_prefix(b"@") {
            Some(name) => match header_value(name, at, headers, budget)? {
                Some(value) => value,
                None => return Ok(None),
            },
            None => decode(value).ok_or_else(bad)?,
        };
        entries.push(Entry { key, value });
    }
    Ok(Some(Descriptor {
        entries,
        limit_override: None,
        hits_addend: None,
        negative_hits: false,
    }))
}

/// Which part of a header `@Header-Name[:first|:last]` takes.
#[derive(Clone, Copy)]
enum Part {
    /// Every field line, joined with commas.
    Whole,
    /// The first or the last comma-separated element, trimmed.
    First,
    Last,
}

/// The value `@spec` copies from the subrequest's headers; `None` when the header is absent.
fn header_value(
    spec: &[u8],
    at: Place,
    headers: &HeaderMap,
    budget: &mut Budget,
) -> Result<Option<String>, HeaderError> {
    let bad_name = || HeaderError::BadHeaderName {
        form: at.form,
        index: at.index,
        header: lossy(spec),
    };
    // A header name cannot contain ':', so the part is unambiguous.
    let (name, part) = match spec.iter().rposition(|b| *b == b':') {
        None => (spec, Part::Whole),
        Some(colon) => match &spec[colon + 1..] {
            b"first" => (&spec[..colon], Part::First),
            b"last" => (&spec[..colon], Part::Last),
            _ => return Err(bad_name()),
        },
    };
    let name = HeaderName::from_bytes(name).map_err(|_| bad_name())?;
    let values = headers.get_all(&name);
    let mut lines = values.iter().map(|v| v.as_bytes());
    let Some(first) = lines.next() else {
        return Ok(None);
    };
    // Client-controlled bytes: never an error (that would be a 500 the client chose), at
    // worst a lossy key that only shares the client's own counter. Each copy counts: a header
    // named by several entries is copied into each.
    let value = match part {
        Part::Whole => {
            let joined = values.iter().map(|v| v.len() + 1).sum::<usize>() - 1;
            budget.take(joined)?;
            let mut value = String::from_utf8_lossy(first).into_owned();
            for more in lines {
                value.push(',');
                value.push_str(&String::from_utf8_lossy(more));
            }
            value
        }
        Part::First => element(first.split(|b| *b == b',').next(), budget)?,
        Part::Last => {
            let last_line = values.iter().next_back().map_or(first, |v| v.as_bytes());
            element(last_line.rsplit(|b| *b == b',').next(), budget)?
        }
    };
    Ok(Some(value))
}

/// One comma-separated element of a header, trimmed and counted.
fn element(raw: Option<&[u8]>, budget: &mut Budget) -> Result<String, HeaderError> {
    let raw = trim(raw.unwrap_or_default());
    budget.take(raw.len())?;
    Ok(String::from_utf8_lossy(raw).into_owned())
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
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

fn bad_encoding(field: &'static str, text: &[u8]) -> HeaderError {
    HeaderError::BadEncoding {
        field,
        text: lossy(text),
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

/// A subrequest whose fields do not make a request: 400 with the reason.
fn bad_request(e: BadRequest) -> Response {
    text(e.http_status(), e)
}

/// Decides one `/nginx` subrequest (refused with 403). Not tied to axum's extractors, so tests
/// call it directly.
pub async fn check<S: CounterStore>(
    service: &RateLimitService<S>,
    headers: &HeaderMap,
    max_bytes: usize,
) -> Response {
    match request_from_headers(headers, max_bytes) {
        Ok(request) => decide(service, request, headers, Endpoint::NGINX).await,
        Err(e) => {
            tracing::debug!(error = %e, "nginx: bad subrequest headers");
            bad_request(e.into())
        }
    }
}

/// Decides one `/forward-auth` subrequest, `query` its query string if it has one.
pub async fn forward_auth<S: CounterStore>(
    service: &RateLimitService<S>,
    query: Option<&str>,
    headers: &HeaderMap,
    max_bytes: usize,
) -> Response {
    match forward_auth_request(query, headers, max_bytes) {
        Ok((request, deny)) => {
            let endpoint = Endpoint {
                deny,
                transport: Transport::ForwardAuth,
            };
            decide(service, request, headers, endpoint).await
        }
        Err(e) => {
            tracing::debug!(error = %e, "forward-auth: bad subrequest");
            bad_request(e.into())
        }
    }
}

/// What differs between the endpoints once the request is decoded.
#[derive(Clone, Copy)]
struct Endpoint {
    /// The status of a refusal.
    deny: StatusCode,
    transport: Transport,
}

impl Endpoint {
    const NGINX: Endpoint = Endpoint {
        deny: StatusCode::FORBIDDEN,
        transport: Transport::Nginx,
    };
}

/// The decision and its answer.
async fn decide<S: CounterStore>(
    service: &RateLimitService<S>,
    request: Request,
    headers: &HeaderMap,
    endpoint: Endpoint,
) -> Response {
    // Every descriptor named an absent header: nothing to count, as Envoy does not call.
    if request.descriptors.is_empty() {
        return StatusCode::OK.into_response();
    }
    let trace = super::trace_context(service.observer().traces(), endpoint.transport, headers);
    let response = match service.should_rate_limit_traced(request, &trace).await {
        Ok(r) => r,
        // Requests beyond Sluice's caps are the config's mistake (400); anything else means
        // Sluice cannot decide (500), and the proxy's config decides whether that fails open.
        Err(e) if e.is_invalid_argument() => return text(StatusCode::BAD_REQUEST, e),
        Err(e) => {
            // Per request, so not at the default level: the service already logs backend
            // failures (rate-limited) and a missing config is logged when it happens.
            tracing::debug!(error = %e, "auth subrequest: no decision");
            return text(StatusCode::INTERNAL_SERVER_ERROR, e);
        }
    };
    let (status, reason) = match response.overall_code {
        Code::Ok => (StatusCode::OK, "OK"),
        Code::OverLimit => (endpoint.deny, "OVER_LIMIT"),
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
    if response.overall_code == Code::Ok
        && let Some(upstream) = &response.request_headers
    {
        add_request_headers(answer.headers_mut(), upstream);
    }
    crate::service::recycle_statuses(response.statuses);
    answer
}

/// LIMIT_REQUEST_HEADERS_ENABLED: an allowed answer also carries the headers meant for the
/// upstream, under LIMIT_REQUEST_*_HEADER's names, for the proxy to copy onto the request it
/// sends on (Traefik's `authResponseHeaders`, Caddy's `copy_headers`, nginx's
/// `auth_request_set`). Not on a refusal, which Traefik and Caddy hand to the client, just as
/// Envoy adds `request_headers_to_add` only to a request it lets through. A name that is one of
/// the fixed headers above is not sent twice: the fixed one, whose meaning nginx configs rely
/// on, stays.
fn add_request_headers(h: &mut HeaderMap, upstream: &crate::service::NamedHeaders) {
    for (name, value) in upstream.pairs() {
        // The settings checked the names; one that is not a header name is left out.
        let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
            continue;
        };
        if let axum::http::header::Entry::Vacant(slot) = h.entry(name) {
            slot.insert(HeaderValue::from(value));
        }
    }
}

/// The `/nginx` and `/forward-auth` routes, merged into PORT's router; `max_bytes` is
/// SLUICE_MAX_REQUEST_BYTES.
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
        .route(
            "/forward-auth",
            any(
                move |State(service): State<Arc<RateLimitService<S>>>,
                      RawQuery(query): RawQuery,
                      headers: HeaderMap| async move {
                    forward_auth(&service, query.as_deref(), &headers, max_bytes).await
                },
            ),
        )
        .with_state(service)
}

#[cfg(test)]
mod tests;
