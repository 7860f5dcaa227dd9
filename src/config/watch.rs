//! The live config shared with request handlers, and the watcher that reloads it.
//!
//! Handlers take a cheap [`Arc`] snapshot per request ([`ConfigHandle::current`]); a reload
//! swaps the pointer atomically, so a request sees one config from start to end and never
//! waits on a lock. The watcher runs a [`Poller`] every poll interval: a few `stat`s when
//! nothing changed, reads of the changed files only, and a load once they have settled.

use super::ConfigErrors;
use super::lookup::RateLimitConfig;
use super::poll::Poller;
use super::runtime::{DEFAULT_MAX_RUNTIME_LIMITS, RuntimeState};
use arc_swap::ArcSwapOption;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::task::JoinHandle;

/// Reload counters (`ratelimit.service.config_load_success` / `config_load_error`).
#[derive(Debug, Default)]
pub struct ConfigStats {
    pub load_success: AtomicU64,
    pub load_error: AtomicU64,
}

/// The current config, shared by everything that serves requests. Cloning is cheap.
///
/// What it serves is composed of the YAML (or xDS) config last stored and the runtime limits
/// set through the API ([`super::runtime`]): a reload replaces the one and keeps the other,
/// and every change to either stores a newly composed config.
#[derive(Clone, Debug, Default)]
pub struct ConfigHandle {
    config: Arc<ArcSwapOption<RateLimitConfig>>,
    runtime: Arc<Mutex<RuntimeState>>,
    stats: Arc<ConfigStats>,
    /// Counts stores, for those who react to a new config (health).
    version: Arc<tokio::sync::watch::Sender<u64>>,
}

impl ConfigHandle {
    /// `None` when starting without a config (FORCE_START_WITHOUT_INITIAL_CONFIG); requests
    /// then fail with "no rate limit configuration loaded" until a load succeeds (or a runtime
    /// limit is set).
    pub fn new(initial: Option<RateLimitConfig>) -> Self {
        Self::with_max_runtime_limits(initial, DEFAULT_MAX_RUNTIME_LIMITS)
    }

    /// As [`ConfigHandle::new`], holding at most `max` runtime limits (SLUICE_MAX_RUNTIME_LIMITS).
    pub fn with_max_runtime_limits(initial: Option<RateLimitConfig>, max: usize) -> Self {
        let state = RuntimeState::new(initial, max);
        ConfigHandle {
            config: Arc::new(ArcSwapOption::new(state.compose().map(Arc::new))),
            runtime: Arc::new(Mutex::new(state)),
            stats: Arc::new(ConfigStats::default()),
            version: Arc::new(tokio::sync::watch::Sender::new(0)),
        }
    }

    pub fn current(&self) -> Option<Arc<RateLimitConfig>> {
        self.config.load_full()
    }

    /// A cheap guard on the current config, with no reference-count traffic.
    pub fn guard(&self) -> arc_swap::Guard<Option<Arc<RateLimitConfig>>> {
        self.config.load()
    }

    /// Stores a newly loaded YAML (or xDS) config; the runtime limits stay over it.
    pub fn store(&self, cfg: RateLimitConfig) {
        self.change(|state| state.set_base(cfg));
    }

    /// Runs `f` on the runtime state and serves what it composes then, under the lock so
    /// that no two changes publish out of order.
    pub fn change<T>(&self, f: impl FnOnce(&mut RuntimeState) -> T) -> T {
        let mut state = self.runtime.lock().unwrap_or_else(PoisonError::into_inner);
        let out = f(&mut state);
        self.config.store(state.compose().map(Arc::new));
        self.version.send_modify(|v| *v += 1);
        out
    }

    /// Reads the runtime state (a preview, the limits to save) without changing it.
    pub fn runtime<T>(&self, f: impl FnOnce(&RuntimeState) -> T) -> T {
        f(&self.runtime.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Changes every time a config is stored.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.version.subscribe()
    }

    pub fn stats(&self) -> &ConfigStats {
        &self.stats
    }
}

/// Stops the watcher task when dropped.
#[derive(Debug)]
#[must_use = "the watcher stops when the guard is dropped"]
pub struct WatchGuard {
    task: JoinHandle<()>,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Polls every `interval` and stores each settled change in `handle`.
///
/// On a change (see [`Poller`] for when a change counts as settled): success stores the new
/// config, counts `load_success` and logs at info; failure keeps the old config, counts
/// `load_error` and logs each `file: reason` at warn, once per change. A poller that loaded the
/// start-up config carries on from what it saw then, so a change made in between is not missed.
///
/// `reload_now` (SIGHUP) makes it look at once and load a change without waiting for it to
/// settle: the operator says the files are complete.
///
/// Must be called within a tokio runtime.
pub fn spawn_watcher(
    poller: Poller,
    handle: ConfigHandle,
    interval: Duration,
    reload_now: Arc<tokio::sync::Notify>,
) -> WatchGuard {
    let poller = Arc::new(Mutex::new(poller));
    let task = tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // The tick's scheduled instant, not the moment the task ran: a settle period that is
            // a multiple of the interval then ends exactly on a tick instead of missing it by
            // microseconds and waiting one more. (The runtime's clock, so tests can pause it.)
            let (now, forced) = tokio::select! {
                at = ticker.tick() => (at.into_std(), false),
                () = reload_now.notified() => (tokio::time::Instant::now().into_std(), true),
            };
            let poller = Arc::clone(&poller);
            // File I/O and parsing block; keep them off the runtime's worker threads. A poll
            // that panicked left the poller consistent enough to look again next tick.
            let polled = tokio::task::spawn_blocking(move || {
                let mut poller = poller.lock().unwrap_or_else(PoisonError::into_inner);
                if forced {
                    poller.poll_now(now)
                } else {
                    poller.poll(now)
                }
            })
            .await;
            if forced && matches!(polled, Ok(None)) {
                tracing::info!("SIGHUP: the config files are unchanged");
            }
            match polled {
                Ok(Some(Ok(cfg))) => {
                    let domains = cfg.domain_count();
                    handle.store(cfg);
                    handle.stats.load_success.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(domains, "config reloaded");
                }
                Ok(Some(Err(errors))) => report(&handle, &errors),
                Ok(None) | Err(_) => {}
            }
        }
    });
    WatchGuard { task }
}

fn report(handle: &ConfigHandle, errors: &ConfigErrors) {
    handle.stats.load_error.fetch_add(1, Ordering::Relaxed);
    for e in errors.iter() {
        tracing::warn!(file = %e.name, reason = %e.message, "config reload failed; keeping the previous config");
    }
}
