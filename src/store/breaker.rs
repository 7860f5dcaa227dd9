//! The backend breaker: once a Redis (or a memcached server) is known down, calls fail at once
//! instead of each waiting REDIS_TIMEOUT, and a probe restores service as soon as it answers
//! again. What follows says Redis; a memcached server's breaker works the same way with its
//! own settings (SLUICE_MEMCACHE_*), and the memcache store makes its connections itself.
//!
//! There is one breaker per target: REDIS_URL's Redis, REDIS_PERSECOND_URL's, and the peer
//! cluster's write-behind copy. A target is one Redis, one Redis Cluster (as a whole: a cluster
//! with a master down answers CLUSTERDOWN for every key anyway, with the default
//! `cluster-require-full-coverage yes`), or the master of a Sentinel group.
//!
//! - **Opening.** A connection failure opens it at once: refused, reset or closed connections,
//!   any I/O error, no Sentinel master. A call that misses REDIS_TIMEOUT only counts: the
//!   breaker opens after SLUICE_REDIS_BREAKER_TIMEOUTS of them in a row with no answer in
//!   between, so one slow call among answered ones never opens it, while a host that accepts
//!   connections and never answers does. Errors Redis answers (NOSCRIPT, WRONGTYPE,
//!   CLUSTERDOWN, LOADING...) never open it: Redis is there, and each has its own handling.
//!   READONLY is the exception when REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR is on (Sluice's
//!   default): the server behind the connection is a replica now, after a failover that
//!   repointed the address, so the connection is replaced (`super::redis_target`).
//!   Failures of calls made on a connection that has since been replaced do not count either.
//! - **Open.** Every call fails at once with a [`StoreError::Backend`] that says Redis is down,
//!   for how long and why; the service answers it UNKNOWN, or OK for the domains that fail open.
//! - **Half-open.** The target's supervisor probes at once, then every
//!   SLUICE_REDIS_PROBE_INTERVAL_MS: a new connection, a PING (to every master of a cluster)
//!   and the scripts loaded, within max(REDIS_TIMEOUT, 1 s). The first probe that succeeds
//!   installs its connection and closes the breaker, so service resumes at most one interval
//!   plus one round trip after Redis is back, whatever back-off a reconnecting client would be
//!   in. Real calls are not let through to test the water: the probe does it, on a connection
//!   it then hands over.
//!
//! - **At start** it is open until Redis first answers; calls made during the first
//!   connection attempt wait for it (within their deadline), later ones fail at once.
//!
//! One warning is logged when a breaker opens and one line when it closes, never one per call;
//! opens and fast failures are counted for `/stats` and `/metrics` ([`BreakerStats`]).
//!
//! [`Readiness`] folds the targets' states into the store's readiness, pushed through a
//! `watch` channel at the instant a state changes: ready once every target has answered, and,
//! with REDIS_HEALTH_CHECK_ACTIVE_CONNECTION, only while no breaker is open.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::{ErrorKind, RedisError};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use super::StoreError;

/// How the breakers of a Redis store behave (validated from SLUICE_REDIS_PROBE_INTERVAL_MS,
/// SLUICE_REDIS_BREAKER_TIMEOUTS, REDIS_HEALTH_CHECK_ACTIVE_CONNECTION and
/// REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerSettings {
    /// How often an open breaker's probe tries Redis again.
    pub probe_interval: Duration,
    /// Calls in a row that miss REDIS_TIMEOUT, with no answer in between, that open it.
    pub open_after_timeouts: NonZeroU32,
    /// Health fails while a breaker is open, not only until Redis first answered.
    pub health_follows_connection: bool,
    /// REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR (Redis only): a READONLY reply (the server
    /// behind the connection was demoted to a replica) opens the breaker, and the probe makes a
    /// new connection through the configured address, installed once it reaches a master.
    pub reconnect_on_readonly: bool,
}

impl Default for BreakerSettings {
    /// A probe every 250 ms: 4 connection attempts a second per Sluice process is nothing to
    /// a Redis, and service comes back within a quarter second. Three timeouts in a row: a
    /// single slow call never opens it, a silent host is found within three calls.
    fn default() -> Self {
        BreakerSettings {
            probe_interval: Duration::from_millis(250),
            open_after_timeouts: NonZeroU32::new(3).expect("3 is not zero"),
            health_follows_connection: false,
            reconnect_on_readonly: true,
        }
    }
}

/// What a breaker did, for the exporters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BreakerStats {
    /// `main`, `per_second` or `write_behind`.
    pub target: &'static str,
    /// Redis answers: connected, breaker closed.
    pub up: bool,
    /// Times the breaker opened.
    pub opens: u64,
    /// Calls answered at once because Redis was down or not connected yet.
    pub fast_failures: u64,
}

/// Which backend a breaker watches, for its messages and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Kind {
    /// `Redis` or `memcached`.
    pub noun: &'static str,
    /// The setting that sets the probe interval.
    pub probe_var: &'static str,
}

pub(super) const REDIS: Kind = Kind {
    noun: "Redis",
    probe_var: "SLUICE_REDIS_PROBE_INTERVAL_MS",
};

/// How a failed call bears on the breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failure {
    /// The connection is unusable: open at once.
    Connection,
    /// No answer within the deadline: count.
    Timeout,
    /// Redis answered, with an error: Redis is there.
    Answered,
}

fn classify(e: &RedisError) -> Failure {
    if e.is_timeout() {
        Failure::Timeout
    } else if e.kind() == ErrorKind::Io || e.is_unrecoverable_error() {
        // Unrecoverable: a protocol desync, refused credentials, a cluster node gone; the
        // connection must be replaced, which is what the probe does.
        Failure::Connection
    } else {
        Failure::Answered
    }
}

enum State {
    /// Before Redis first answered.
    Connecting {
        last_error: Option<String>,
    },
    Up,
    Down {
        since: Instant,
        cause: String,
    },
}

/// One target's breaker.
pub(super) struct Breaker {
    kind: Kind,
    target: &'static str,
    /// The URLs, credentials removed, for messages and logs.
    name: String,
    settings: BreakerSettings,
    state: ArcSwap<State>,
    timeouts: AtomicU32,
    opens: AtomicU64,
    fast_failures: AtomicU64,
    /// Its server left the store: it no longer counts towards readiness.
    left: AtomicBool,
    opened: Notify,
    /// Wakes the calls waiting for the first connection attempt.
    attempted: Notify,
    readiness: Arc<Readiness>,
}

impl Breaker {
    /// A breaker that is open until Redis first answers ([`Breaker::close`]).
    pub(super) fn new(
        kind: Kind,
        target: &'static str,
        name: String,
        settings: BreakerSettings,
        readiness: Arc<Readiness>,
    ) -> Self {
        Breaker {
            kind,
            target,
            name,
            settings,
            state: ArcSwap::from_pointee(State::Connecting { last_error: None }),
            timeouts: AtomicU32::new(0),
            opens: AtomicU64::new(0),
            fast_failures: AtomicU64::new(0),
            left: AtomicBool::new(false),
            opened: Notify::new(),
            attempted: Notify::new(),
            readiness,
        }
    }

    /// `Ok` while calls may go to Redis; otherwise the error to answer at once.
    pub(super) fn check(&self) -> Result<(), StoreError> {
        let message = match &**self.state.load() {
            State::Up => return Ok(()),
            State::Connecting { last_error: None } => {
                format!("not connected to {} yet", self.kind.noun)
            }
            State::Connecting {
                last_error: Some(e),
            } => format!(
                "not connected to {} yet; last connection error: {e}",
                self.kind.noun
            ),
            State::Down { since, cause } => format!(
                "{} {} is down (for {:.1?}: {cause}); calls fail at once until a probe, \
                 every {:?} ({}), gets an answer",
                self.kind.noun,
                self.name,
                since.elapsed(),
                self.settings.probe_interval,
                self.kind.probe_var,
            ),
        };
        self.fast_failures.fetch_add(1, Ordering::Relaxed);
        Err(StoreError::Backend { message })
    }

    /// The target's URLs, credentials removed.
    pub(super) fn settings(&self) -> BreakerSettings {
        self.settings
    }

    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// Whether Redis has answered once (the breaker may have opened since).
    pub(super) fn has_answered(&self) -> bool {
        !matches!(**self.state.load(), State::Connecting { .. })
    }

    /// Whether Redis has answered and the breaker is closed.
    pub(super) fn is_up(&self) -> bool {
        matches!(**self.state.load(), State::Up)
    }

    /// A call got an answer: the timeouts in a row start again from zero.
    pub(super) fn answered(&self) {
        // Read first: the common case writes nothing, so busy callers share the cache line.
        if self.timeouts.load(Ordering::Relaxed) != 0 {
            self.timeouts.store(0, Ordering::Relaxed);
        }
    }

    /// A call failed with `e`; opens the breaker if that says Redis is gone.
    pub(super) fn failed(&self, e: &RedisError) {
        match classify(e) {
            Failure::Connection => {
                self.connection_failed(e.to_string());
            }
            Failure::Timeout => {
                self.timed_out(&e.to_string());
            }
            Failure::Answered => self.answered(),
        }
    }

    /// A call missed its deadline; true if that opened the breaker.
    pub(super) fn timed_out(&self, cause: &str) -> bool {
        let n = self.timeouts.fetch_add(1, Ordering::Relaxed) + 1;
        n >= self.settings.open_after_timeouts.get()
            && self.connection_failed(format!(
                "{n} calls in a row got no answer; the last: {cause}"
            ))
    }

    /// The connection is unusable (refused, reset, closed, a protocol error): opens a closed
    /// breaker; true if this call opened it.
    pub(super) fn connection_failed(&self, cause: String) -> bool {
        let current = self.state.load_full();
        if !matches!(*current, State::Up) {
            return false;
        }
        let down = Arc::new(State::Down {
            since: Instant::now(),
            cause: cause.clone(),
        });
        let previous = self.state.compare_and_swap(&current, down);
        if !Arc::ptr_eq(&previous, &current) {
            return false;
        }
        self.opens.fetch_add(1, Ordering::Relaxed);
        self.readiness_change(|r| r.down += 1);
        tracing::warn!(
            backend = self.kind.noun,
            server = %self.name,
            error = %cause,
            probe_every = ?self.settings.probe_interval,
            "backend down: calls fail at once until a probe gets an answer"
        );
        self.opened.notify_one();
        true
    }

    /// Whether the first connection attempt is still under way.
    pub(super) fn first_attempt_pending(&self) -> bool {
        matches!(**self.state.load(), State::Connecting { last_error: None })
    }

    /// Completes once the first connection attempt has succeeded or failed.
    pub(super) async fn first_attempt(&self) {
        let attempted = self.attempted.notified();
        tokio::pin!(attempted);
        // Registered before the check, so an attempt ending in between is not missed.
        attempted.as_mut().enable();
        if self.first_attempt_pending() {
            attempted.await;
        }
    }

    /// Completes once the breaker has opened (at once if it is open or not connected yet).
    pub(super) async fn wait_open(&self) {
        while self.is_up() {
            let opened = self.opened.notified();
            tokio::pin!(opened);
            // Registered before the check, so an open in between is not missed.
            opened.as_mut().enable();
            if !self.is_up() {
                return;
            }
            opened.await;
        }
    }

    /// A probe (or start-up check) failed: the breaker stays open, with `e` as the reason.
    pub(super) fn still_down(&self, e: impl std::fmt::Display) {
        let current = self.state.load_full();
        let next = match &*current {
            State::Up => return,
            State::Connecting { .. } => State::Connecting {
                last_error: Some(e.to_string()),
            },
            State::Down { since, .. } => State::Down {
                since: *since,
                cause: format!("last probe: {e}"),
            },
        };
        self.state.compare_and_swap(&current, Arc::new(next));
        self.attempted.notify_waiters();
    }

    /// Redis answered a probe (or the start-up check): calls go to Redis again.
    pub(super) fn close(&self) {
        self.timeouts.store(0, Ordering::Relaxed);
        let previous = self.state.swap(Arc::new(State::Up));
        self.attempted.notify_waiters();
        match &*previous {
            State::Up => {}
            State::Connecting { .. } => {
                self.readiness_change(|r| r.connecting -= 1);
                tracing::info!(backend = self.kind.noun, server = %self.name, "backend answered; ready");
            }
            State::Down { since, .. } => {
                self.readiness_change(|r| r.down -= 1);
                tracing::info!(
                    backend = self.kind.noun,
                    server = %self.name,
                    down_for = ?since.elapsed(),
                    "backend answered again: calls go to it again"
                );
            }
        }
    }

    fn readiness_change(&self, f: impl FnOnce(&mut Counts)) {
        if !self.left.load(Ordering::Acquire) {
            self.readiness.change(f);
        }
    }

    /// Its server left the store (an SRV refresh no longer names it): from now on it does not
    /// hold readiness back, whatever its state.
    pub(super) fn leave(&self) {
        if self.left.swap(true, Ordering::AcqRel) {
            return;
        }
        match **self.state.load() {
            State::Up => {}
            State::Connecting { .. } => self.readiness.change(|r| r.connecting -= 1),
            State::Down { .. } => self.readiness.change(|r| r.down -= 1),
        }
    }

    pub(super) fn stats(&self) -> BreakerStats {
        BreakerStats {
            target: self.target,
            up: self.is_up(),
            opens: self.opens.load(Ordering::Relaxed),
            fast_failures: self.fast_failures.load(Ordering::Relaxed),
        }
    }
}

/// The targets' states, counted.
#[derive(Clone, Copy, Debug)]
pub(super) struct Counts {
    /// Targets that have not answered yet.
    connecting: usize,
    /// Targets whose breaker is open.
    down: usize,
}

/// A store's readiness, pushed to subscribers whenever it changes.
pub(super) struct Readiness {
    follow_connection: bool,
    counts: std::sync::Mutex<Counts>,
    ready: watch::Sender<bool>,
}

impl Readiness {
    /// For `targets` targets, none connected yet; `follow_connection`:
    /// REDIS_HEALTH_CHECK_ACTIVE_CONNECTION.
    pub(super) fn new(targets: usize, follow_connection: bool) -> Arc<Self> {
        Arc::new(Readiness {
            follow_connection,
            counts: std::sync::Mutex::new(Counts {
                connecting: targets,
                down: 0,
            }),
            ready: watch::channel(targets == 0).0,
        })
    }

    fn change(&self, f: impl FnOnce(&mut Counts)) {
        // One lock for the counts and the push, so concurrent changes are pushed in order.
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut counts);
        let ready = counts.connecting == 0 && (counts.down == 0 || !self.follow_connection);
        self.ready
            .send_if_modified(|r| std::mem::replace(r, ready) != ready);
    }

    pub(super) fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    pub(super) fn subscribe(&self) -> watch::Receiver<bool> {
        self.ready.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker(timeouts: u32, follow: bool) -> (Breaker, Arc<Readiness>) {
        let readiness = Readiness::new(1, follow);
        let settings = BreakerSettings {
            open_after_timeouts: NonZeroU32::new(timeouts).unwrap(),
            health_follows_connection: follow,
            ..BreakerSettings::default()
        };
        let b = Breaker::new(
            REDIS,
            "main",
            "redis://x".into(),
            settings,
            readiness.clone(),
        );
        (b, readiness)
    }

    fn io(kind: std::io::ErrorKind) -> RedisError {
        RedisError::from(std::io::Error::from(kind))
    }

    fn server(code: &str) -> RedisError {
        redis::parse_redis_value(format!("-{code} detail\r\n").as_bytes())
            .and_then(|v| v.extract_error())
            .expect_err("a server error")
    }

    #[test]
    fn calls_fail_at_once_until_redis_first_answers() {
        let (b, readiness) = breaker(3, false);
        b.still_down("Connection refused");
        let e = b.check().unwrap_err().to_string();
        assert!(e.contains("not connected to Redis yet"), "{e}");
        assert!(e.contains("Connection refused"), "{e}");
        assert!(!readiness.is_ready());
        b.close();
        assert!(b.check().is_ok());
        assert!(readiness.is_ready());
        assert_eq!(b.stats().opens, 0, "connecting is not an open");
        assert_eq!(b.stats().fast_failures, 1);
    }

    #[test]
    fn a_connection_failure_opens_at_once_and_a_probe_closes() {
        let (b, _) = breaker(3, false);
        b.close();
        b.failed(&io(std::io::ErrorKind::ConnectionRefused));
        let e = b.check().unwrap_err().to_string();
        assert!(e.contains("is down"), "{e}");
        assert!(e.contains("SLUICE_REDIS_PROBE_INTERVAL_MS"), "{e}");
        b.still_down("Connection refused (os error 111)");
        let e = b.check().unwrap_err().to_string();
        assert!(e.contains("last probe: Connection refused"), "{e}");
        b.close();
        assert!(b.check().is_ok());
        assert_eq!(
            b.stats(),
            BreakerStats {
                target: "main",
                up: true,
                opens: 1,
                fast_failures: 2
            }
        );
    }

    #[test]
    fn timeouts_open_only_when_nothing_answers_in_between() {
        let (b, _) = breaker(3, false);
        b.close();
        let timeout = io(std::io::ErrorKind::TimedOut);
        for _ in 0..10 {
            b.failed(&timeout);
            b.failed(&timeout);
            b.answered();
        }
        assert!(b.is_up(), "one slow call among answered ones opened it");
        b.failed(&timeout);
        b.failed(&timeout);
        assert!(b.timed_out("deadline"));
        assert!(!b.is_up());
    }

    #[test]
    fn errors_redis_answers_never_open_it() {
        let (b, _) = breaker(1, false);
        b.close();
        for code in [
            "NOSCRIPT",
            "WRONGTYPE",
            "READONLY",
            "CLUSTERDOWN",
            "LOADING",
            "ERR",
        ] {
            let e = server(code);
            assert_eq!(classify(&e), Failure::Answered, "{code}: {e:?}");
            b.failed(&e);
        }
        assert!(b.is_up());
        for kind in [
            std::io::ErrorKind::ConnectionReset,
            std::io::ErrorKind::BrokenPipe,
            std::io::ErrorKind::UnexpectedEof,
        ] {
            assert_eq!(classify(&io(kind)), Failure::Connection, "{kind:?}");
        }
    }

    #[test]
    fn readiness_follows_the_breaker_only_when_asked() {
        for follow in [false, true] {
            let (b, readiness) = breaker(1, follow);
            let mut rx = readiness.subscribe();
            assert!(!*rx.borrow_and_update());
            b.close();
            assert!(rx.has_changed().unwrap() && *rx.borrow_and_update());
            b.failed(&io(std::io::ErrorKind::ConnectionRefused));
            assert_eq!(readiness.is_ready(), !follow);
            assert_eq!(rx.has_changed().unwrap(), follow);
            assert_eq!(*rx.borrow_and_update(), !follow);
            b.close();
            assert!(readiness.is_ready() && *rx.borrow_and_update());
        }
    }

    #[tokio::test]
    async fn calls_wait_for_the_first_attempt_only() {
        let (b, _) = breaker(1, false);
        let b = Arc::new(b);
        assert!(b.first_attempt_pending());
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.first_attempt().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        b.still_down("Connection refused");
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .unwrap();
        assert!(
            !b.first_attempt_pending(),
            "a failed attempt is not pending"
        );
        b.first_attempt().await;
    }

    #[tokio::test]
    async fn wait_open_returns_once_opened() {
        let (b, _) = breaker(1, false);
        let b = Arc::new(b);
        b.wait_open().await; // connecting counts as open
        b.close();
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.wait_open().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        b.failed(&io(std::io::ErrorKind::ConnectionReset));
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .unwrap();
    }
}
