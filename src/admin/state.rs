//! What the debug listener's endpoints and the status page read ([`super::debug`],
//! [`super::status`]): the config, the store's gauges, the stats, the listeners, the quota
//! service, the counter admin, the hot keys and the clock.

use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;

use crate::clock::{Clock, Timestamp};
use crate::cluster::lease::KeyView;
use crate::config::ConfigHandle;
use crate::descriptor::Request;
use crate::net::{ByteBudget, PortGuard};
use crate::rlqs::RlqsService;
use crate::service::{CounterView, HotKeys, RateLimitService, ServiceError};
use crate::store::CounterStore;
use crate::telemetry::Stats;
use crate::telemetry::otlp::trace::SpanCounters;
use crate::telemetry::prometheus::StoreReport;

/// What the debug endpoints read; `spans` is the tracer's counters when tracing is on.
#[derive(Clone)]
pub(crate) struct DebugState {
    pub config: ConfigHandle,
    pub store: Arc<dyn StoreGauges>,
    pub stats: Arc<Stats>,
    pub spans: Option<Arc<SpanCounters>>,
    /// The serving listeners, and the gRPC message byte budget they share.
    pub listeners: Vec<Arc<PortGuard>>,
    pub budget: Option<Arc<ByteBudget>>,
    /// The Rate Limit Quota Service's state.
    pub quota: Option<Arc<RlqsService>>,
    /// The counter admin (`/debug/counters`).
    pub counters: CounterAdmin,
    /// The status page's hot keys and clock, and its calls-per-second sample.
    pub hot: Arc<HotKeys>,
    pub clock: Arc<dyn Clock>,
    pub calls: Arc<CallRate>,
    /// The runtime limits API (`/limits/...`).
    pub limits: Arc<super::limits::LimitsApi>,
    /// The served config's limits as the exporters read them.
    pub limit_table: Arc<crate::telemetry::limits::LimitTableCache>,
}

/// What `/debug/counters` reads and resets through: the service, whether a reset is allowed
/// (SLUICE_DEBUG_COUNTER_RESET; the debug port has no authentication), and the request cap.
#[derive(Clone)]
pub(crate) struct CounterAdmin {
    pub service: Arc<dyn Counters>,
    pub reset_enabled: bool,
    pub max_request_bytes: usize,
}

/// The service's counter admin, without its store's type.
pub(crate) trait Counters: Send + Sync {
    fn inspect<'a>(
        &'a self,
        request: &'a Request,
    ) -> BoxFuture<'a, Result<Vec<CounterView>, ServiceError>>;
    fn reset<'a>(
        &'a self,
        request: &'a Request,
    ) -> BoxFuture<'a, Result<Vec<CounterView>, ServiceError>>;
    fn explain<'a>(
        &'a self,
        request: &'a Request,
    ) -> BoxFuture<'a, Result<serde_json::Value, ServiceError>>;
}

impl<S: CounterStore> Counters for RateLimitService<S> {
    fn inspect<'a>(
        &'a self,
        request: &'a Request,
    ) -> BoxFuture<'a, Result<Vec<CounterView>, ServiceError>> {
        Box::pin(self.inspect_counters(request))
    }

    fn reset<'a>(
        &'a self,
        request: &'a Request,
    ) -> BoxFuture<'a, Result<Vec<CounterView>, ServiceError>> {
        Box::pin(self.reset_counters(request))
    }

    fn explain<'a>(
        &'a self,
        request: &'a Request,
    ) -> BoxFuture<'a, Result<serde_json::Value, ServiceError>> {
        Box::pin(RateLimitService::explain(self, request, true))
    }
}

impl<S: CounterStore> super::limits::Explainer for RateLimitService<S> {
    fn explain_in<'a>(
        &'a self,
        config: Arc<crate::config::RateLimitConfig>,
        request: Request,
    ) -> BoxFuture<'a, serde_json::Value> {
        Box::pin(async move {
            let explained = RateLimitService::explain_in(self, Some(&config), &request, true);
            explained
                .await
                .unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }))
        })
    }

    fn budget(&self, request: Request) -> BoxFuture<'_, serde_json::Value> {
        Box::pin(async move {
            match self.inspect_counters(&request).await {
                Ok(views) => views.iter().map(crate::service::counter_json).collect(),
                Err(e) => serde_json::json!({ "error": e.to_string() }),
            }
        })
    }
}

/// What the debug port reads of the counter store. The composition root implements it for the
/// store it chose, so the admin knows no store but through this.
pub(crate) trait StoreGauges: Send + Sync {
    /// What the store reports of itself for `/metrics`, statsd, OTLP and the status page.
    fn report(&self) -> StoreReport;
    /// Lease mode: one counter key's leases as this node sees them; `None` outside lease mode.
    fn lease(&self, key: &str) -> Option<KeyView>;
}

/// The calls counted when the status page was last rendered, and when: calls per second are
/// measured between two renderings.
#[derive(Debug, Default)]
pub(crate) struct CallRate {
    last: Mutex<Option<(Timestamp, u64)>>,
}

impl CallRate {
    /// Calls per second between the last rendering and `now`, when there was one.
    #[allow(clippy::cast_precision_loss, reason = "a rate for display")]
    pub(crate) fn per_second(&self, now: Timestamp, total: u64) -> Option<f64> {
        let mut last = self.last.lock().ok()?;
        let rate = last.and_then(|(at, was)| {
            let secs = now.micros().saturating_sub(at.micros()) as f64 / 1e6;
            (secs > 0.0).then(|| total.saturating_sub(was) as f64 / secs)
        });
        *last = Some((now, total));
        rate
    }
}
