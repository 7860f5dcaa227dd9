//! Health as envoyproxy/ratelimit reports it: failing after SIGTERM, until the backend (Redis)
//! has answered its start-up PING (with REDIS_HEALTH_CHECK_ACTIVE_CONNECTION, also while Redis
//! is down), and (with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED) while no domain is loaded. `/healthcheck` and the
//! gRPC health service `ratelimit` both read this; service `""` is always SERVING.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::config::ConfigHandle;

/// Whether the backend can take requests (see [`crate::store::AnyStore::is_ready`]).
pub type BackendReady = Arc<dyn Fn() -> bool + Send + Sync>;

pub struct Health {
    sigterm: AtomicBool,
    require_config: bool,
    config: ConfigHandle,
    backend_ready: BackendReady,
}

impl Health {
    pub fn new(config: ConfigHandle, require_config: bool, backend_ready: BackendReady) -> Self {
        Health {
            sigterm: AtomicBool::new(false),
            require_config,
            config,
            backend_ready,
        }
    }

    /// Marks the process as shutting down; health fails from now on.
    pub fn fail_sigterm(&self) {
        self.sigterm.store(true, Ordering::SeqCst);
    }

    pub fn is_healthy(&self) -> bool {
        if self.sigterm.load(Ordering::SeqCst) || !(self.backend_ready)() {
            return false;
        }
        !self.require_config || self.config.current().is_some_and(|c| c.domain_count() > 0)
    }
}
