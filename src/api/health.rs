//! Health as envoyproxy/ratelimit reports it: failing after SIGTERM, until the backend (Redis)
//! has answered its start-up PING (with REDIS_HEALTH_CHECK_ACTIVE_CONNECTION, also while Redis
//! is down), and (with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED) while no domain is loaded.
//! `/healthcheck` and the gRPC health service `ratelimit` both compute it when asked, so they
//! always agree; gRPC `Watch` streams get each change the moment its cause happens (SIGTERM, a
//! config stored, the backend's readiness pushed), with no polling. Service `""` is always
//! SERVING.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;

use crate::config::ConfigHandle;

pub struct Health {
    sigterm: AtomicBool,
    require_config: bool,
    config: ConfigHandle,
    /// Whether the backend can take requests, pushed when it changes
    /// ([`crate::app::AnyStore::ready_changes`]).
    backend_ready: watch::Receiver<bool>,
    /// The answer as last computed, for those who wait for it to change (gRPC `Watch`).
    status: watch::Sender<bool>,
}

impl Health {
    pub fn new(
        config: ConfigHandle,
        require_config: bool,
        backend_ready: watch::Receiver<bool>,
    ) -> Self {
        let health = Health {
            sigterm: AtomicBool::new(false),
            require_config,
            config,
            backend_ready,
            status: watch::Sender::new(false),
        };
        health.refresh();
        health
    }

    /// Marks the process as shutting down; health fails from now on.
    pub fn fail_sigterm(&self) {
        self.sigterm.store(true, Ordering::SeqCst);
        self.refresh();
    }

    /// Computed at the moment of asking, so `/healthcheck` and the gRPC `Check` of the
    /// `ratelimit` service always agree.
    pub fn is_healthy(&self) -> bool {
        if self.sigterm.load(Ordering::SeqCst) || !*self.backend_ready.borrow() {
            return false;
        }
        !self.require_config || self.config.current().is_some_and(|c| c.domain_count() > 0)
    }

    /// Recomputes the answer and tells the subscribers if it changed.
    pub fn refresh(&self) {
        let now = self.is_healthy();
        self.status
            .send_if_modified(|status| std::mem::replace(status, now) != now);
    }

    /// The answer, now and at every change.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.status.subscribe()
    }

    /// Refreshes the answer the moment the config or the backend's readiness changes; runs
    /// until aborted. (SIGTERM refreshes it itself.)
    pub fn follow(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let health = self.clone();
        let mut config = self.config.changes();
        let mut backend = Some(self.backend_ready.clone());
        tokio::spawn(async move {
            loop {
                let backend_changed = async {
                    match &mut backend {
                        Some(rx) => rx.changed().await.is_ok(),
                        // A backend that is always ready never changes.
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    changed = config.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                    still = backend_changed => {
                        if !still {
                            backend = None;
                        }
                    }
                }
                health.refresh();
            }
        })
    }
}
