//! The debug listener on DEBUG_PORT: `/rlconfig` (the loaded limits, one line each, in the Go
//! service's format), `/metrics` (the Prometheus exposition), `/stats` (the service counters
//! as `name: value` lines) and `/debug/counters` (a request's counters, read without counting,
//! and their reset when SLUICE_DEBUG_COUNTER_RESET allows it). [`metrics_router`] serves the
//! exposition alone, for the USE_PROMETHEUS listener. What they read is
//! [`super::state::DebugState`].

pub(crate) use super::state::{CounterAdmin, DebugState, StoreGauges};

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{any, get, post};

use crate::api::bad_request::BadRequest;
use crate::descriptor::Request;
use crate::net::PortGuard;
use crate::rlqs::RlqsService;
use crate::service::{ServiceError, counter_json};
use crate::telemetry::otlp::trace::SpanCounters;
use crate::telemetry::prometheus::{self, Extra, ListenerGauges, RlqsGauges};

/// The router for DEBUG_PORT.
pub(crate) fn router(state: DebugState) -> Router {
    Router::new()
        .route("/", get(status_page))
        .route("/rlconfig", get(rlconfig))
        .route("/stats", get(stats_text))
        .route("/metrics", get(metrics))
        .route("/debug/lease", get(lease))
        .route("/debug/rlqs", get(rlqs))
        .route("/debug/counters", get(inspect_counters))
        .route("/debug/counters/reset", post(reset_counters))
        .route("/debug/explain", get(explain).post(explain_json))
        .route("/limits/{*rest}", any(limits))
        .with_state(Arc::new(state))
}

/// `/limits/...`: the runtime limits API ([`super::limits`]).
async fn limits(
    State(st): State<Arc<DebugState>>,
    method: axum::http::Method,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> axum::response::Response {
    super::limits::handle(Arc::clone(&st.limits), method, uri, headers, body).await
}

/// `GET /debug/counters?domain=D&descriptor=k=v&k2=v2&descriptor=...` (the query form of
/// `/forward-auth`): every counter the request would be charged against, read with a peek of
/// 0 hits (nothing is counted), as JSON.
async fn inspect_counters(
    State(st): State<Arc<DebugState>>,
    uri: axum::http::Uri,
) -> axum::response::Response {
    counters_answer(&st, uri.query(), false).await
}

/// `POST /debug/counters/reset?...`: forgets those counters, then answers as the `GET` does.
/// Refused with 403 unless SLUICE_DEBUG_COUNTER_RESET is true.
async fn reset_counters(
    State(st): State<Arc<DebugState>>,
    uri: axum::http::Uri,
) -> axum::response::Response {
    counters_answer(&st, uri.query(), true).await
}

/// `GET /debug/explain?...` (the query of `/debug/counters`): what `ShouldRateLimit` would do
/// with the request, step by step, without counting (`sluice explain` prints it).
async fn explain(
    State(st): State<Arc<DebugState>>,
    uri: axum::http::Uri,
) -> axum::response::Response {
    let request = match query_request(&st, uri.query()) {
        Ok(r) => r,
        Err(e) => return bad_request(&e),
    };
    match st.counters.service.explain(&request).await {
        Ok(body) => json_answer(&body),
        Err(e) => service_error(&e),
    }
}

/// `POST /debug/explain` with a `/json` body (overrides and per-descriptor hits included).
async fn explain_json(
    State(st): State<Arc<DebugState>>,
    body: axum::body::Body,
) -> axum::response::Response {
    let admin = &st.counters;
    let read = crate::api::body::read(body, admin.max_request_bytes).await;
    let request = match read.and_then(|bytes| crate::api::json::request(&bytes)) {
        Ok(r) => r,
        Err(e) => return bad_request(&e),
    };
    match admin.service.explain(&request).await {
        Ok(body) => json_answer(&body),
        Err(e) => service_error(&e),
    }
}

fn plain(status: StatusCode, text: &str) -> axum::response::Response {
    (status, format!("{text}\n")).into_response()
}

/// A request that could not be decoded: 400, or 413 for a body over SLUICE_MAX_REQUEST_BYTES.
fn bad_request(e: &BadRequest) -> axum::response::Response {
    plain(e.http_status(), &e.to_string())
}

fn json_answer(body: &serde_json::Value) -> axum::response::Response {
    super::limits::answer(StatusCode::OK, body)
}

fn service_error(e: &ServiceError) -> axum::response::Response {
    let status = if e.is_invalid_argument() {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    plain(status, &e.to_string())
}

/// The request in `query` (the `/forward-auth` query form), or why it cannot be read.
fn query_request(st: &DebugState, query: Option<&str>) -> Result<Request, BadRequest> {
    super::explain::query(query, st.counters.max_request_bytes)
}

async fn counters_answer(
    st: &DebugState,
    query: Option<&str>,
    reset: bool,
) -> axum::response::Response {
    if reset && !st.counters.reset_enabled {
        let why = "counter reset is off: set SLUICE_DEBUG_COUNTER_RESET=true to allow it (the \
                   debug port has no authentication; keep it private)";
        return plain(StatusCode::FORBIDDEN, why);
    }
    let request = match query_request(st, query) {
        Ok(r) => r,
        Err(e) => return bad_request(&e),
    };
    let admin = &st.counters;
    let answer = if reset {
        admin.service.reset(&request).await
    } else {
        admin.service.inspect(&request).await
    };
    match answer {
        Ok(views) => {
            if reset {
                tracing::warn!(domain = %request.domain, counters = views.len(), "counters reset through the debug port");
            }
            json_answer(&serde_json::json!({
                "domain": request.domain,
                "counters": views.iter().map(counter_json).collect::<Vec<_>>(),
            }))
        }
        Err(e) => service_error(&e),
    }
}

/// The query of `/debug/rlqs`: one bucket's key (`domain_key_value_...`), or the busiest.
#[derive(serde::Deserialize)]
struct RlqsQuery {
    key: Option<String>,
}

/// `/debug/rlqs`: the busiest buckets (at most [`prometheus::RLQS_METRIC_BUCKETS`]), or the one
/// at `?key=`, with every Envoy's demand and part, as JSON.
async fn rlqs(
    State(st): State<Arc<DebugState>>,
    Query(q): Query<RlqsQuery>,
) -> axum::response::Response {
    let Some(quota) = &st.quota else {
        return (StatusCode::NOT_FOUND, "no quota service\n").into_response();
    };
    let body = match q.key {
        Some(key) => match quota.bucket(&key) {
            Some(view) => serde_json::to_string(&view),
            None => return (StatusCode::NOT_FOUND, "no such bucket\n").into_response(),
        },
        None => serde_json::to_string(&quota.top(prometheus::RLQS_METRIC_BUCKETS)),
    };
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.unwrap_or_default(),
    )
        .into_response()
}

/// The query of `/debug/lease`: the counter key, as in `/debug/lease?key=d_k_v_`.
#[derive(serde::Deserialize)]
struct LeaseQuery {
    key: String,
}

/// `/debug/lease?key=<counter key>`: what this node holds of the key, its owner, and when this
/// node is the owner, every node's lease, as JSON. 404 outside lease mode.
async fn lease(
    State(st): State<Arc<DebugState>>,
    Query(q): Query<LeaseQuery>,
) -> axum::response::Response {
    match st.store.lease(&q.key) {
        Some(view) => (
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::to_string(&view).unwrap_or_default(),
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            "not in lease mode (SLUICE_CLUSTER_MODE=lease)\n",
        )
            .into_response(),
    }
}

/// A router serving only the exposition at `path` (PROMETHEUS_ADDR, PROMETHEUS_PATH).
pub(crate) fn metrics_router(path: &str, state: DebugState) -> Router {
    Router::new()
        .route(path, get(metrics))
        .with_state(Arc::new(state))
}

/// `/`: the status page.
async fn status_page(State(st): State<Arc<DebugState>>) -> axum::response::Response {
    let now = crate::clock::Timestamp::from_nanos(st.clock.now_nanos());
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        super::status::render(&st, now),
    )
        .into_response()
}

async fn rlconfig(State(st): State<Arc<DebugState>>) -> String {
    st.config.current().map(|c| c.dump()).unwrap_or_default()
}

impl DebugState {
    /// The numbers the exporters report from outside the stats registry.
    pub(crate) fn extra(&self) -> Extra {
        let mut extra = telemetry_extra(self);
        extra.listeners = self.listeners.iter().map(|g| listener_gauges(g)).collect();
        extra.pending_request_bytes = self.budget.as_ref().map_or(0, |b| b.in_use() as u64);
        extra.rlqs = self.quota.as_deref().map(rlqs_gauges);
        let (puts, deletes) = self.limits.changes();
        let sync = self.limits.sync_counts().unwrap_or_default();
        extra.runtime = prometheus::RuntimeGauges {
            limits: self.config.runtime(|s| s.len()) as u64,
            puts,
            deletes,
            syncs: [sync.same, sync.differed, sync.failed],
            missed_pushes: sync.missed_pushes,
        };
        extra
    }
}

fn telemetry_extra(st: &DebugState) -> Extra {
    let (store, spans) = (st.store.as_ref(), st.spans.as_deref());
    let c = st.config.stats();
    Extra {
        limits: st
            .config
            .current()
            .map(|cfg| st.limit_table.table(&cfg))
            .unwrap_or_default(),
        config_load_success: c.load_success.load(Ordering::Relaxed),
        config_load_error: c.load_error.load(Ordering::Relaxed),
        store: store.report(),
        tracing: spans.map(SpanCounters::snapshot).unwrap_or_default(),
        listeners: Vec::new(),
        pending_request_bytes: 0,
        rlqs: None,
        runtime: prometheus::RuntimeGauges::default(),
    }
}

fn rlqs_gauges(q: &RlqsService) -> RlqsGauges {
    let c = &q.counters;
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let g = q.gauges();
    RlqsGauges {
        counters: vec![
            ("reports", load(&c.reports)),
            ("assignments", load(&c.assignments)),
            ("pushed", load(&c.pushed)),
            ("malformed", load(&c.malformed)),
            ("refused", load(&c.refused)),
            ("abandoned", load(&c.abandoned)),
            ("expired", load(&c.expired)),
            ("sync_failures", load(&c.sync_failures)),
        ],
        gauges: vec![
            ("streams", g.streams as u64),
            ("buckets", g.buckets as u64),
            ("holders", g.holders as u64),
            ("bytes", g.bytes as u64),
        ],
        buckets: q
            .top(prometheus::RLQS_METRIC_BUCKETS)
            .into_iter()
            .map(|b| (b.key, b.demand, b.assigned))
            .collect(),
    }
}

fn listener_gauges(guard: &PortGuard) -> ListenerGauges {
    let s = &guard.stats;
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    ListenerGauges {
        port: guard.port,
        connections: s.connections.load(Ordering::Relaxed) as u64,
        inflight_requests: guard.inflight() as u64,
        refused: [
            ("inflight", load(&s.refused_inflight)),
            ("deadline", load(&s.deadline_exceeded)),
            ("message_size", load(&s.refused_message_size)),
            ("pending_bytes", load(&s.refused_budget)),
        ],
        idle_closed: load(&s.idle_closed),
    }
}

async fn metrics(State(st): State<Arc<DebugState>>) -> impl IntoResponse {
    let body = prometheus::render(&st.stats, &st.extra());
    ([(header::CONTENT_TYPE, prometheus::CONTENT_TYPE)], body)
}

/// The concurrency limits' slot counters and slots held (this node's calls), for each limit
/// that ever took a slot: `ratelimit.service.rate_limit.<key>.slots_<stat>: n`.
fn slot_stats(out: &mut String, stats: &crate::telemetry::Stats) {
    use crate::telemetry::stats::LimitCounters;
    for entry in stats.entries() {
        let values = entry.counters.values();
        if !LimitCounters::holds_slots(&values) {
            continue;
        }
        let name = &entry.name;
        let slots = LimitCounters::SLOTS..LimitCounters::SLOTS + 3;
        for (stat, v) in LimitCounters::NAMES[slots.clone()]
            .iter()
            .zip(&values[slots])
        {
            out.push_str(&format!(
                "ratelimit.service.rate_limit.{name}.{stat}: {v}\n"
            ));
        }
        let held = LimitCounters::slots_held(&values);
        out.push_str(&format!(
            "ratelimit.service.rate_limit.{name}.slots_held: {held}\n"
        ));
    }
}

async fn stats_text(State(st): State<Arc<DebugState>>) -> String {
    let e = st.extra();
    let svc = &st.stats.service;
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let mut out = format!(
        "ratelimit.service.config_load_success: {}\nratelimit.service.config_load_error: {}\n\
         ratelimit.service.global_shadow_mode: {}\n\
         ratelimit.service.call.should_rate_limit.redis_error: {}\n\
         ratelimit.service.call.should_rate_limit.service_error: {}\n\
         ratelimit_server.ShouldRateLimit.total_requests: {}\n",
        e.config_load_success,
        e.config_load_error,
        load(&svc.global_shadow_mode),
        load(&svc.redis_error),
        load(&svc.service_error),
        svc.total_requests.get(),
    );
    slot_stats(&mut out, &st.stats);
    if let Some(m) = e.store.memory {
        out.push_str(&format!(
            "sluice.memory.live_counters: {}\nsluice.memory.max_counters: {}\n\
             sluice.memory.used_bytes: {}\nsluice.memory.budget_bytes: {}\n\
             sluice.memory.rejected_full: {}\nsluice.memory.swept: {}\n\
             sluice.memory.penalties_dropped: {}\n",
            m.live_counters,
            m.max_counters,
            m.counter_bytes,
            m.max_counter_bytes,
            m.rejected_full,
            m.swept,
            m.penalties_dropped,
        ));
    }
    if let Some(c) = &e.store.cluster {
        out.push_str(&format!(
            "sluice.cluster.local_hits: {}\nsluice.cluster.forwarded_hits: {}\nsluice.cluster.peer_calls: {}\nsluice.cluster.failed_forwards: {}\nsluice.cluster.alone_hits: {}\nsluice.cluster.majority: {}\n",
            c.local_hits, c.forwarded_hits, c.peer_calls, c.failed_forwards, c.alone_hits, u8::from(c.majority),
        ));
        out.push_str(&format!(
            "sluice.cluster.relayed_hits: {}\nsluice.cluster.failed_relays: {}\nsluice.cluster.taken_over: {}\nsluice.cluster.joining: {}\n",
            c.relayed_hits, c.failed_relays, c.taken_over, u8::from(c.joining),
        ));
        for (stat, value) in &c.durable {
            out.push_str(&format!("sluice.cluster.durable.{stat}: {value}\n"));
        }
        for (stat, value) in &c.lease {
            out.push_str(&format!("sluice.cluster.lease.{stat}: {value}\n"));
        }
        for (peer, up) in &c.peers {
            out.push_str(&format!(
                "sluice.cluster.peer_up.{peer}: {}\n",
                u8::from(*up)
            ));
        }
    }
    let redis = e.store.redis.iter().map(|b| ("redis", b));
    for (backend, b) in redis.chain(e.store.memcache.iter().map(|b| ("memcache", b))) {
        let t = &b.target;
        out.push_str(&format!(
            "sluice.{backend}.{t}.up: {}\nsluice.{backend}.{t}.breaker_opens: {}\nsluice.{backend}.{t}.fast_failures: {}\n",
            u8::from(b.up),
            b.opens,
            b.fast_failures,
        ));
    }
    if let Some(r) = &e.rlqs {
        for (stat, value) in r.counters.iter().chain(&r.gauges) {
            out.push_str(&format!("sluice.rlqs.{stat}: {value}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request as HttpRequest;
    use tower_service::Service;

    use super::*;
    use crate::clock::{ManualClock, Timestamp};
    use crate::cluster::lease::KeyView;
    use crate::config::{LoadOptions, parse_files};
    use crate::service::{HotKeys, RateLimitService, ServiceOptions};
    use crate::store::MemoryStore;
    use crate::telemetry::prometheus::StoreReport;

    const MAX_BYTES: usize = 128;

    struct NoStore;

    impl StoreGauges for NoStore {
        fn report(&self) -> StoreReport {
            StoreReport::default()
        }
        fn lease(&self, _key: &str) -> Option<KeyView> {
            None
        }
    }

    fn state() -> DebugState {
        let yaml = "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";
        let files = [("edge.yaml".to_string(), yaml.to_string())];
        let cfg = parse_files(&files, &LoadOptions::default()).expect("test config loads");
        let config = crate::config::ConfigHandle::new(Some(cfg));
        let clock = Arc::new(ManualClock::new(Timestamp::from_secs(2222)));
        let service = Arc::new(RateLimitService::new(
            config.clone(),
            Arc::new(MemoryStore::new(1000)),
            clock.clone(),
            ServiceOptions::default(),
        ));
        let limits = crate::admin::limits::LimitsApi::new(
            config.clone(),
            crate::admin::auth::AdminAuth::off(),
            10,
            clock.clone(),
            service.clone(),
            Vec::new(),
            Arc::from("n"),
        );
        DebugState {
            limits: Arc::new(limits),
            config,
            store: Arc::new(NoStore),
            stats: Arc::default(),
            spans: None,
            listeners: Vec::new(),
            budget: None,
            quota: None,
            counters: CounterAdmin {
                service,
                reset_enabled: false,
                max_request_bytes: MAX_BYTES,
            },
            hot: Arc::new(HotKeys::default()),
            clock,
            calls: Arc::default(),
            limit_table: Arc::default(),
        }
    }

    async fn call(method: &str, uri: &str, body: &str) -> (StatusCode, String) {
        let request = HttpRequest::builder()
            .method(method)
            .uri(uri)
            .body(Body::from(body.to_owned()))
            .expect("a request");
        let response = router(state()).call(request).await.expect("infallible");
        crate::api::body::answer(response).await
    }

    #[tokio::test]
    async fn explain_refuses_a_body_over_the_cap_with_413() {
        let body = format!(
            r#"{{"domain":"edge","descriptors":[],"x":"{}"}}"#,
            "a".repeat(128)
        );
        let (status, text) = call("POST", "/debug/explain", &body).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{text}");
        assert_eq!(
            text,
            "request body is larger than 128 bytes (SLUICE_MAX_REQUEST_BYTES)\n"
        );
    }

    #[tokio::test]
    async fn explain_refuses_a_bad_body_or_query_with_400_and_the_reason() {
        let (status, text) = call("POST", "/debug/explain", "{nope").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
        assert!(
            text.starts_with("request body is not valid JSON: "),
            "{text}"
        );
        let (status, text) = call("GET", "/debug/explain?descriptor=k=v", "").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
        assert!(
            text.starts_with("query parameter descriptor without domain"),
            "{text}"
        );
        let (status, text) = call("GET", "/debug/counters?domain=edge&nope=1", "").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
        assert!(
            text.starts_with("unknown query parameter \"nope\""),
            "{text}"
        );
    }

    #[tokio::test]
    async fn explain_answers_a_request_in_either_form() {
        let (status, text) = call("GET", "/debug/explain?domain=edge&descriptor=k=v", "").await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let body = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
        let (status, text) = call("POST", "/debug/explain", body).await;
        assert_eq!(status, StatusCode::OK, "{text}");
    }
}
