//! The debug listener on DEBUG_PORT: `/rlconfig` (the loaded limits, one line each, in the Go
//! service's format) and `/stats` (Sluice's service counters as `name: value` lines).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::routing::get;

use crate::config::ConfigHandle;
use crate::store::AnyStore;

struct DebugState {
    config: ConfigHandle,
    store: Arc<AnyStore>,
}

/// The router for DEBUG_PORT.
pub fn router(config: ConfigHandle, store: Arc<AnyStore>) -> Router {
    Router::new()
        .route("/rlconfig", get(rlconfig))
        .route("/stats", get(stats))
        .with_state(Arc::new(DebugState { config, store }))
}

async fn rlconfig(State(st): State<Arc<DebugState>>) -> String {
    st.config.current().map(|c| c.dump()).unwrap_or_default()
}

async fn stats(State(st): State<Arc<DebugState>>) -> String {
    let c = st.config.stats();
    let mut out = format!(
        "ratelimit.service.config_load_success: {}\nratelimit.service.config_load_error: {}\n",
        c.load_success.load(Ordering::Relaxed),
        c.load_error.load(Ordering::Relaxed),
    );
    if let Some(m) = st.store.memory() {
        out.push_str(&format!(
            "sluice.memory.live_counters: {}\nsluice.memory.max_counters: {}\nsluice.memory.rejected_full: {}\nsluice.memory.swept: {}\n",
            m.live_counters(),
            m.max_counters(),
            m.stats().rejected_full.load(Ordering::Relaxed),
            m.stats().swept.load(Ordering::Relaxed),
        ));
    }
    if let crate::store::AnyStore::Cluster(c) = &*st.store {
        for (peer, up) in c.peers() {
            out.push_str(&format!(
                "sluice.cluster.peer_up.{peer}: {}\n",
                u8::from(up)
            ));
        }
    }
    out
}
