//! Health as envoyproxy/ratelimit reports it: failing after SIGTERM, until the backend (Redis)
//! has answered its start-up PING (with REDIS_HEALTH_CHECK_ACTIVE_CONNECTION, also while Redis
//! is down), and (with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED) while no domain is loaded; and,
//! Sluice's own, until the runtime limits shared with other nodes are first loaded (from Redis's
//! hash, or a peer's set: docs/runtime-limits.md). `/healthcheck` and the gRPC health service
//! `ratelimit` both compute it when asked, so they always agree; `/healthcheck`'s 500 says why
//! in its body. gRPC `Watch` streams get each change the moment its cause happens (SIGTERM, a
//! config stored, the backend's readiness pushed, the runtime limits loaded), with no polling.
//! Service `""` is always SERVING.

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
    /// Whether the runtime limits shared with other nodes have been loaded once; always true
    /// for a node that shares none (its limits file, if any, is loaded before any port is
    /// bound).
    runtime_loaded: watch::Receiver<bool>,
    /// The answer as last computed, for those who wait for it to change (gRPC `Watch`).
    status: watch::Sender<bool>,
}

/// Why health fails, as `/healthcheck`'s 500 says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unhealthy {
    ShuttingDown,
    BackendNotReady,
    NoConfig,
    RuntimeLimitsNotLoaded,
}

impl std::fmt::Display for Unhealthy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Unhealthy::ShuttingDown => "shutting down",
            Unhealthy::BackendNotReady => "the backend is not ready",
            Unhealthy::NoConfig => "no domain is loaded (HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED)",
            Unhealthy::RuntimeLimitsNotLoaded => {
                "the runtime limits are not loaded yet (from a peer, or from Redis)"
            }
        })
    }
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
            runtime_loaded: watch::channel(true).1,
            status: watch::Sender::new(false),
        };
        health.refresh();
        health
    }

    /// Fails until `loaded` turns true: the first load of the runtime limits shared with other
    /// nodes.
    pub(crate) fn with_runtime_loaded(mut self, loaded: watch::Receiver<bool>) -> Self {
        self.runtime_loaded = loaded;
        self.refresh();
        self
    }

    /// Marks the process as shutting down; health fails from now on.
    pub(crate) fn fail_sigterm(&self) {
        self.sigterm.store(true, Ordering::SeqCst);
        self.refresh();
    }

    /// Computed at the moment of asking, so `/healthcheck` and the gRPC `Check` of the
    /// `ratelimit` service always agree.
    pub(crate) fn is_healthy(&self) -> bool {
        self.unhealthy().is_none()
    }

    /// Why health fails now; `None` when it does not.
    pub fn unhealthy(&self) -> Option<Unhealthy> {
        if self.sigterm.load(Ordering::SeqCst) {
            return Some(Unhealthy::ShuttingDown);
        }
        if !*self.backend_ready.borrow() {
            return Some(Unhealthy::BackendNotReady);
        }
        if self.require_config && self.config.current().is_none_or(|c| c.domain_count() == 0) {
            return Some(Unhealthy::NoConfig);
        }
        (!*self.runtime_loaded.borrow()).then_some(Unhealthy::RuntimeLimitsNotLoaded)
    }

    /// Recomputes the answer and tells the subscribers if it changed.
    pub fn refresh(&self) {
        let now = self.is_healthy();
        self.status
            .send_if_modified(|status| std::mem::replace(status, now) != now);
    }

    /// The answer, now and at every change.
    pub(crate) fn subscribe(&self) -> watch::Receiver<bool> {
        self.status.subscribe()
    }

    /// Refreshes the answer the moment the config, the backend's readiness or the runtime
    /// limits' first load changes; runs until aborted. (SIGTERM refreshes it itself.)
    pub fn follow(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let health = self.clone();
        let mut config = self.config.changes();
        let mut backend = Some(self.backend_ready.clone());
        let mut runtime = Some(self.runtime_loaded.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    changed = config.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                    () = changed_or_gone(&mut backend) => {}
                    () = changed_or_gone(&mut runtime) => {}
                }
                health.refresh();
            }
        })
    }
}

/// Completes when `rx` changes, or when its sender is gone (then `rx` becomes `None`, and this
/// never completes again: a sender that is gone never changes the value).
async fn changed_or_gone(rx: &mut Option<watch::Receiver<bool>>) {
    match rx {
        Some(r) => {
            if r.changed().await.is_err() {
                *rx = None;
            }
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn health_waits_for_the_runtime_limits_and_watchers_hear_when_they_load() {
        let (loaded, rx) = watch::channel(false);
        let health = Arc::new(
            Health::new(ConfigHandle::new(None), false, watch::channel(true).1)
                .with_runtime_loaded(rx),
        );
        assert_eq!(health.unhealthy(), Some(Unhealthy::RuntimeLimitsNotLoaded));
        assert_eq!(
            Unhealthy::RuntimeLimitsNotLoaded.to_string(),
            "the runtime limits are not loaded yet (from a peer, or from Redis)"
        );
        let mut status = health.subscribe();
        assert!(!*status.borrow_and_update());
        let follow = health.follow();
        loaded.send_replace(true);
        tokio::time::timeout(std::time::Duration::from_secs(5), status.changed())
            .await
            .expect("told within 5 s")
            .unwrap();
        assert!(*status.borrow());
        assert!(health.is_healthy());
        // SIGTERM still comes first.
        health.fail_sigterm();
        assert_eq!(health.unhealthy(), Some(Unhealthy::ShuttingDown));
        follow.abort();
    }
}
