//! The live config shared with request handlers, and the watcher that reloads it.
//!
//! Handlers take a cheap [`Arc`] snapshot per request ([`ConfigHandle::current`]); a reload
//! swaps the pointer atomically, so a request sees one config from start to end and never
//! waits on a lock. The watcher polls rather than using inotify: polling sees a ConfigMap's
//! atomic `..data` symlink swap, files on network volumes, and editors' rename-over-write
//! alike, and at one stat-and-read of a few small files per interval it costs nothing.

use super::ConfigErrors;
use super::compile::RateLimitConfig;
use super::load::{ConfigSource, LoadOptions, Snapshot, parse_snapshot, read_source};
use arc_swap::ArcSwapOption;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::task::JoinHandle;

/// Reload counters (`ratelimit.service.config_load_success` / `config_load_error`).
#[derive(Debug, Default)]
pub struct ConfigStats {
    pub load_success: AtomicU64,
    pub load_error: AtomicU64,
}

/// The current config, shared by everything that serves requests. Cloning is cheap.
#[derive(Clone, Debug, Default)]
pub struct ConfigHandle {
    config: Arc<ArcSwapOption<RateLimitConfig>>,
    stats: Arc<ConfigStats>,
}

impl ConfigHandle {
    /// `None` when starting without a config (FORCE_START_WITHOUT_INITIAL_CONFIG); requests
    /// then fail with "no rate limit configuration loaded" until a load succeeds.
    pub fn new(initial: Option<RateLimitConfig>) -> Self {
        ConfigHandle {
            config: Arc::new(ArcSwapOption::new(initial.map(Arc::new))),
            stats: Arc::new(ConfigStats::default()),
        }
    }

    pub fn current(&self) -> Option<Arc<RateLimitConfig>> {
        self.config.load_full()
    }

    /// A cheap guard on the current config, with no reference-count traffic.
    pub fn guard(&self) -> arc_swap::Guard<Option<Arc<RateLimitConfig>>> {
        self.config.load()
    }

    pub fn store(&self, cfg: RateLimitConfig) {
        self.config.store(Some(Arc::new(cfg)));
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

/// What the watcher last saw, so it only acts on a change.
#[derive(PartialEq)]
enum Seen {
    Files(Snapshot),
    /// The source itself could not be read (e.g. the directory vanished); the message is kept
    /// so the same failure is counted and logged once, not every poll.
    Unreadable(String),
}

fn snapshot(source: &ConfigSource) -> Seen {
    match read_source(source) {
        Ok(files) => Seen::Files(files),
        Err(e) => Seen::Unreadable(e.to_string()),
    }
}

/// Polls `source` every `poll` and reloads when its files change.
///
/// The fingerprint is the sorted file names plus every file's bytes (read through symlinks), so
/// any content change, added or removed file, or ConfigMap symlink swap is noticed, and a
/// `touch` is not. On change: success stores the new config, counts `load_success` and logs at
/// info; failure keeps the old config, counts `load_error` and logs each `file: reason` at
/// warn. The baseline is taken now, so the config the caller loaded is not loaded again.
///
/// Must be called within a tokio runtime.
pub fn spawn_watcher(
    source: ConfigSource,
    opts: LoadOptions,
    handle: ConfigHandle,
    poll: Duration,
) -> WatchGuard {
    let baseline = snapshot(&source);
    let source = Arc::new(source);
    let task = tokio::spawn(async move {
        let mut seen = baseline;
        let mut ticker = tokio::time::interval(poll);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick completes immediately; the baseline already covers "now".
        ticker.tick().await;
        loop {
            ticker.tick().await;
            let src = Arc::clone(&source);
            // File I/O and parsing block; keep them off the runtime's worker threads.
            let polled = tokio::task::spawn_blocking(move || snapshot(&src)).await;
            let Ok(now) = polled else {
                // The blocking task panicked or was cancelled; try again next tick.
                continue;
            };
            if now == seen {
                continue;
            }
            match &now {
                Seen::Unreadable(reason) => {
                    handle.stats.load_error.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %reason, "config reload failed; keeping the previous config");
                }
                Seen::Files(files) => match parse_snapshot(files, &opts) {
                    Ok(cfg) => {
                        let domains = cfg.domain_count();
                        handle.store(cfg);
                        handle.stats.load_success.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(files = files.len(), domains, "config reloaded");
                    }
                    Err(errors) => report(&handle, &errors),
                },
            }
            seen = now;
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
