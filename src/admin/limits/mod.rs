//! The runtime limits API on the debug port (issue 38; docs/runtime-limits.md):
//!
//! - `PUT /limits/<domain>/<k>=<v>[/<k2>[=<v2>]...]` with a JSON object of `rate_limit` fields
//!   sets that path's limit: 201 when the path had none, 200 when it replaced one; the answer
//!   is the limit as `GET` returns it. `?dry_run=true` checks the change and answers what it
//!   would do, with the explain output for the path after it, and changes nothing.
//! - `GET` on the same path: the limit as set (the body of its `PUT`); 404 if none.
//! - `DELETE` on the same path: 204; 404 if none (`?dry_run=true` as for `PUT`).
//! - `GET /limits/<domain>`: the domain's runtime limits, by path, a page at a time
//!   (`?limit=N`, at most [`MAX_PAGE`]; `?after=<path>` for the next page).
//! - `GET /limits/_history`: the last changes, oldest first ([`history`]).
//! - `?budget=true` on either `GET`: each limit with its counters as they stand
//!   (`/debug/counters`' view: used, reserved, remaining and reset), at most
//!   [`MAX_BUDGET_PAGE`] limits a page.
//!
//! Every call needs `Authorization: Bearer <token>` with a token of SLUICE_ADMIN_TOKEN_FILE
//! ([`super::auth`]): 401 without one, 403 with a wrong one, 403 for every call when the
//! variable is unset. Errors are JSON, `{"error": "..."}`, with their status: 400 for a bad
//! path, query or body (the YAML's own message for a bad limit), 404, 405, 413 for a body over
//! [`MAX_BODY_BYTES`], 507 past SLUICE_MAX_RUNTIME_LIMITS, 503 when the change applies but
//! could not be saved. A change that some peers did not take is answered as usual, with the
//! header [`MISSED_PEERS`] naming them: the next anti-entropy pass brings it to them.

pub(crate) mod history;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Body;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use self::history::{History, Op, Record};
use super::auth::{AdminAuth, Refusal};
use super::limits_path::{Level, LimitsPath};
use crate::clock::Clock;
use crate::config::runtime::{Change, PathLevel, PutError, Replicated, RuntimeLimit, path_text};
use crate::config::{ConfigHandle, RateLimitConfig};
use crate::descriptor::{Descriptor, Entry, Request};
use crate::percent;
use crate::runtime_limits::Sink;

/// The largest `PUT` body: a `rate_limit`'s fields fit in far less.
pub(crate) const MAX_BODY_BYTES: usize = 64 * 1024;

/// The header of a `PUT` or `DELETE` answer naming the peers the change did not reach when the
/// API answered, comma-separated: it applies here and on the other peers, and reaches these at
/// the next anti-entropy pass (within SLUICE_RUNTIME_LIMITS_SYNC_MS, once they answer).
pub(crate) const MISSED_PEERS: &str = "sluice-missed-peers";

/// The most limits one `GET /limits/<domain>` answers (and its default).
pub(crate) const MAX_PAGE: usize = 10_000;
pub(crate) const DEFAULT_PAGE: usize = 1_000;
/// The most limits a `?budget=true` page answers (and its default): each reads its counters
/// from the store.
pub(crate) const MAX_BUDGET_PAGE: usize = 100;

/// What explains a dry run's path: the service's explain, on a config that is not served.
pub(crate) trait Explainer: Send + Sync {
    fn explain_in<'a>(
        &'a self,
        config: Arc<RateLimitConfig>,
        request: Request,
    ) -> futures_util::future::BoxFuture<'a, Value>;

    /// The counters `request` would be charged against, as `/debug/counters` shows them (a
    /// JSON list), or `{"error": ..}`.
    fn budget(&self, request: Request) -> futures_util::future::BoxFuture<'_, Value>;
}

/// The API's state.
pub(crate) struct LimitsApi {
    config: ConfigHandle,
    auth: AdminAuth,
    history: History,
    clock: Arc<dyn Clock>,
    explainer: Arc<dyn Explainer>,
    sinks: Vec<Arc<dyn Sink>>,
    /// This node's name in the stamps of its changes: PEER_ADVERTISE_ADDRESS, or "".
    origin: Arc<str>,
    puts: AtomicU64,
    deletes: AtomicU64,
}

impl LimitsApi {
    pub(crate) fn new(
        config: ConfigHandle,
        auth: AdminAuth,
        history: usize,
        clock: Arc<dyn Clock>,
        explainer: Arc<dyn Explainer>,
        sinks: Vec<Arc<dyn Sink>>,
        origin: Arc<str>,
    ) -> Self {
        LimitsApi {
            config,
            auth,
            history: History::new(history),
            clock,
            explainer,
            sinks,
            origin,
            puts: AtomicU64::new(0),
            deletes: AtomicU64::new(0),
        }
    }

    /// The changes made through this node's API: (puts, deletes).
    pub(crate) fn changes(&self) -> (u64, u64) {
        (
            self.puts.load(Ordering::Relaxed),
            self.deletes.load(Ordering::Relaxed),
        )
    }

    /// The peer cluster's anti-entropy counts; `None` without peers.
    pub(crate) fn sync_counts(&self) -> Option<crate::runtime_limits::SyncCounts> {
        self.sinks.iter().find_map(|s| s.sync_counts())
    }
}

/// An answer that is an error: `{"error": message}` with `status`.
fn error(status: StatusCode, message: impl std::fmt::Display) -> Response {
    answer(status, &json!({ "error": message.to_string() }))
}

/// A JSON answer, one line, with `status` (the debug port's other JSON endpoints' too).
pub(crate) fn answer(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        format!("{body}\n"),
    )
        .into_response()
}

fn refused(r: &Refusal) -> Response {
    let mut response = error(r.status(), r);
    if *r == Refusal::NoCredentials {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
    }
    response
}

fn not_allowed(allow: &'static str) -> Response {
    let mut response = error(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("this path takes {allow}"),
    );
    response
        .headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static(allow));
    response
}

/// The query parameters the API takes.
#[derive(Debug, Default, PartialEq)]
struct Params {
    dry_run: bool,
    budget: bool,
    after: Option<String>,
    limit: Option<usize>,
}

/// A query parameter the API does not take.
#[derive(Debug, thiserror::Error)]
enum BadParam {
    #[error("query parameter {0}: a bad percent-encoding")]
    Encoding(String),
    #[error("{name}={value}: expected true or false")]
    Flag { name: String, value: String },
    #[error("limit={0}: expected a number from 1 to {MAX_PAGE}")]
    Limit(String),
    #[error("unknown query parameter {0:?} (the API takes dry_run, budget, after and limit)")]
    Unknown(String),
}

fn params(query: Option<&str>) -> Result<Params, BadParam> {
    let mut out = Params::default();
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value =
            percent::decode(value.as_bytes()).ok_or_else(|| BadParam::Encoding(name.to_owned()))?;
        let flag = |value: &str| match value {
            "true" | "" => Ok(true),
            "false" => Ok(false),
            other => Err(BadParam::Flag {
                name: name.to_owned(),
                value: other.to_owned(),
            }),
        };
        match name {
            "dry_run" => out.dry_run = flag(&value)?,
            "budget" => out.budget = flag(&value)?,
            "after" => out.after = Some(value),
            "limit" => {
                let n = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_PAGE).contains(n));
                out.limit = Some(n.ok_or_else(|| BadParam::Limit(value.clone()))?);
            }
            other => return Err(BadParam::Unknown(other.to_owned())),
        }
    }
    Ok(out)
}

/// A request whose one descriptor is a runtime limit's path (a key-only level with an empty
/// value): what a dry run explains and a budget reads.
fn path_request(domain: &str, levels: &[PathLevel<'_>]) -> Request {
    Request {
        domain: domain.to_owned(),
        descriptors: vec![Descriptor {
            entries: levels
                .iter()
                .map(|(k, v)| Entry::new(*k, v.unwrap_or_default()))
                .collect(),
            ..Descriptor::default()
        }],
        ..Request::default()
    }
}

fn borrowed(levels: &[Level]) -> Vec<PathLevel<'_>> {
    levels
        .iter()
        .map(|l| (l.key.as_str(), l.value.as_deref().filter(|v| !v.is_empty())))
        .collect()
}

/// Every call on `/limits/...`.
pub(crate) async fn handle(
    api: Arc<LimitsApi>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Err(e) = api.auth.refresh() {
        tracing::warn!(error = %e, "SLUICE_ADMIN_TOKEN_FILE does not parse: the tokens read before stay in force");
    }
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let who = match api.auth.check(authorization) {
        Ok(who) => who,
        Err(r) => return refused(&r),
    };
    let path = match LimitsPath::parse(uri.path()) {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let params = match params(uri.query()) {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    match (method, path) {
        (Method::GET, LimitsPath::History) => answer(StatusCode::OK, &api.history.json()),
        (Method::GET, LimitsPath::Domain(domain)) => list(&api, &domain, &params).await,
        (Method::GET, LimitsPath::Limit { domain, levels }) => {
            get(&api, &domain, &levels, params.budget).await
        }
        (Method::PUT, LimitsPath::Limit { domain, levels }) => {
            let body = match put_body(body).await {
                Ok(v) => v,
                Err(refused) => return refused,
            };
            let call = Call {
                api: &api,
                who,
                domain: &domain,
                levels: &borrowed(&levels),
            };
            if params.dry_run {
                call.preview_put(body).await
            } else {
                call.put(body).await
            }
        }
        (Method::DELETE, LimitsPath::Limit { domain, levels }) => {
            let call = Call {
                api: &api,
                who,
                domain: &domain,
                levels: &borrowed(&levels),
            };
            if params.dry_run {
                call.preview_delete().await
            } else {
                call.delete().await
            }
        }
        (_, LimitsPath::Limit { .. }) => not_allowed("GET, PUT, DELETE"),
        (_, LimitsPath::Domain(_) | LimitsPath::History) => not_allowed("GET"),
    }
}

/// A `PUT`'s body as JSON; the answer to send instead when it is too large (413) or not JSON
/// (400).
async fn put_body(body: Body) -> Result<Value, Response> {
    let bytes = match crate::api::body::read(body, MAX_BODY_BYTES).await {
        Ok(b) => b,
        // The body reader's message names SLUICE_MAX_REQUEST_BYTES, which does not set this cap.
        Err(e) if e.kind() == crate::api::bad_request::Kind::BodyTooLarge => {
            return Err(error(
                e.http_status(),
                format!("the body is larger than {MAX_BODY_BYTES} bytes"),
            ));
        }
        Err(e) => return Err(error(e.http_status(), e)),
    };
    serde_json::from_slice(&bytes).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            format!("the body is not JSON: {e}"),
        )
    })
}

async fn get(api: &LimitsApi, domain: &str, levels: &[Level], budget: bool) -> Response {
    let levels = borrowed(levels);
    let config = api.config.current();
    let found = config
        .as_deref()
        .and_then(|c| c.domain(domain))
        .and_then(|d| d.runtime_limit(&levels));
    match found {
        Some(r) if budget => {
            let counters = api.explainer.budget(path_request(domain, &levels)).await;
            answer(
                StatusCode::OK,
                &json!({"limit": r.body, "budget": counters}),
            )
        }
        Some(r) => answer(StatusCode::OK, &r.body),
        None => error(
            StatusCode::NOT_FOUND,
            format!("no runtime limit at {domain}/{}", path_text(&levels)),
        ),
    }
}

async fn list(api: &LimitsApi, domain: &str, params: &Params) -> Response {
    let config = api.config.current();
    let mut limits: Vec<(String, &Arc<RuntimeLimit>)> = config
        .as_deref()
        .and_then(|c| c.domain(domain))
        .map(|d| {
            d.runtime_limits()
                .map(|r| (path_text(&r.path()), r))
                .filter(|(p, _)| params.after.as_ref().is_none_or(|a| p > a))
                .collect()
        })
        .unwrap_or_default();
    limits.sort_by(|a, b| a.0.cmp(&b.0));
    let page = match params.budget {
        true => params.limit.unwrap_or(MAX_BUDGET_PAGE).min(MAX_BUDGET_PAGE),
        false => params.limit.unwrap_or(DEFAULT_PAGE),
    };
    let next = (limits.len() > page).then(|| limits[page - 1].0.clone());
    limits.truncate(page);
    let mut items = Vec::with_capacity(limits.len());
    for (path, r) in &limits {
        let mut item = json!({"path": path, "limit": r.body});
        if params.budget {
            item["budget"] = api.explainer.budget(path_request(domain, &r.path())).await;
        }
        items.push(item);
    }
    answer(
        StatusCode::OK,
        &json!({"domain": domain, "limits": items, "next": next}),
    )
}

/// One change's call: who makes it, where.
struct Call<'a> {
    api: &'a LimitsApi,
    who: String,
    domain: &'a str,
    levels: &'a [PathLevel<'a>],
}

impl Call<'_> {
    async fn put(self, body: Value) -> Response {
        let (domain, levels) = (self.domain, self.levels);
        let made = (self.api.clock.now().micros(), &self.api.origin);
        let applied = self.api.config.change(|s| {
            let put = s.put(domain, levels, body, made);
            put.map(|(change, limit)| (change, limit, s.sequence()))
        });
        let (change, limit, sequence) = match applied {
            Ok(a) => a,
            Err(e) => return put_error(&e),
        };
        self.api.puts.fetch_add(1, Ordering::Relaxed);
        let (status, old) = match change {
            Change::Created => (StatusCode::CREATED, None),
            Change::Replaced { old } => (StatusCode::OK, Some(old.body.clone())),
        };
        self.audit(Op::Put, old, Some(limit.body.clone()));
        match self
            .settled(sequence, &Replicated::of(domain, &limit))
            .await
        {
            Ok(missed) => with_missed(answer(status, &limit.body), &missed),
            Err(e) => e,
        }
    }

    async fn delete(self) -> Response {
        let (domain, levels) = (self.domain, self.levels);
        let made = (self.api.clock.now().micros(), &self.api.origin);
        let removed = self.api.config.change(|s| {
            s.remove(domain, levels, made)
                .map(|old| (old, s.sequence()))
        });
        let Some(((old, removal), sequence)) = removed else {
            return self.not_found();
        };
        self.api.deletes.fetch_add(1, Ordering::Relaxed);
        self.audit(Op::Delete, Some(old.body.clone()), None);
        match self.settled(sequence, &removal).await {
            Ok(missed) => with_missed(StatusCode::NO_CONTENT.into_response(), &missed),
            Err(e) => e,
        }
    }

    async fn preview_put(self, body: Value) -> Response {
        let preview = self
            .api
            .config
            .runtime(|s| s.preview_put(self.domain, self.levels, body));
        let (change, limit, config) = match preview {
            Ok(p) => p,
            Err(e) => return put_error(&e),
        };
        let (would, old) = match change {
            Change::Created => ("create", None),
            Change::Replaced { old } => ("replace", Some(old.body.clone())),
        };
        self.dry_run(would, old, Some(limit.body.clone()), config)
            .await
    }

    async fn preview_delete(self) -> Response {
        let preview = self
            .api
            .config
            .runtime(|s| s.preview_remove(self.domain, self.levels));
        let Some((old, config)) = preview else {
            return self.not_found();
        };
        self.dry_run("delete", Some(old.body.clone()), None, config)
            .await
    }

    /// A dry run's answer: what the change would do, and the path explained after it.
    async fn dry_run(
        &self,
        would: &str,
        old: Option<Value>,
        new: Option<Value>,
        config: RateLimitConfig,
    ) -> Response {
        let explain = self
            .api
            .explainer
            .explain_in(Arc::new(config), self.request())
            .await;
        answer(
            StatusCode::OK,
            &json!({
                "dry_run": true,
                "would": would,
                "domain": self.domain,
                "path": path_text(self.levels),
                "old": old,
                "new": new,
                "explain": explain,
            }),
        )
    }

    fn request(&self) -> Request {
        path_request(self.domain, self.levels)
    }

    fn not_found(&self) -> Response {
        error(
            StatusCode::NOT_FOUND,
            format!(
                "no runtime limit at {}/{}",
                self.domain,
                path_text(self.levels)
            ),
        )
    }

    fn audit(&self, op: Op, old: Option<Value>, new: Option<Value>) {
        self.api.history.record(Record {
            time: self.api.clock.now().rfc3339(),
            who: self.who.clone(),
            op,
            domain: self.domain.to_owned(),
            path: path_text(self.levels),
            old,
            new,
        });
    }

    /// Waits until every sink has the change: the peers it did not reach; the error answer if
    /// a sink does not have it.
    async fn settled(&self, sequence: u64, change: &Replicated) -> Result<Vec<String>, Response> {
        let all = self.api.sinks.iter().map(|s| s.settled(sequence, change));
        let (mut missed, mut failed) = (Vec::new(), Vec::new());
        for settled in futures_util::future::join_all(all).await {
            match settled {
                Ok(peers) => missed.extend(peers),
                Err(e) => failed.push(e),
            }
        }
        if failed.is_empty() {
            return Ok(missed);
        }
        Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the change applies on this node but is not saved: {}",
                failed
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        ))
    }
}

/// `response` with the [`MISSED_PEERS`] header when a change missed some peers.
fn with_missed(mut response: Response, missed: &[String]) -> Response {
    if let Ok(value) = header::HeaderValue::from_str(&missed.join(", "))
        && !missed.is_empty()
    {
        response.headers_mut().insert(MISSED_PEERS, value);
    }
    response
}

fn put_error(e: &PutError) -> Response {
    let status = match e {
        PutError::Invalid(_) => StatusCode::BAD_REQUEST,
        PutError::Full { .. } => StatusCode::INSUFFICIENT_STORAGE,
    };
    error(status, e)
}

#[cfg(test)]
mod tests;
