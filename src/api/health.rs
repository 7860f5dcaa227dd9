//! Health as envoyproxy/ratelimit reports it: failing after SIGTERM, and (with
//! HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED) while no domain is loaded. `/healthcheck` and the
//! gRPC health service `ratelimit` both read this; service `""` is always SERVING.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::config::ConfigHandle;

pub struct Health {
    sigterm: AtomicBool,
    require_config: bool,
    config: ConfigHandle,
}

impl Health {
    pub fn new(config: ConfigHandle, require_config: bool) -> Self {
        Health {
            sigterm: AtomicBool::new(false),
            require_config,
            config,
        }
    }

    /// Marks the process as shutting down; health fails from now on.
    pub fn fail_sigterm(&self) {
        self.sigterm.store(true, Ordering::SeqCst);
    }

    pub fn is_healthy(&self) -> bool {
        if self.sigterm.load(Ordering::SeqCst) {
            return false;
        }
        !self.require_config || self.config.current().is_some_and(|c| c.domain_count() > 0)
    }
}
