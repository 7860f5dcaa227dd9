//! The backend choice: which counter store a running Sluice uses ([`Backend`], from
//! BACKEND_TYPE and the peers), and the store built from it ([`AnyStore`]). It lives in the
//! composition root because it names every store, the peer cluster's included, while the
//! cluster itself is built on `store`: `store` knows nothing of `cluster`.

use std::sync::atomic::Ordering;

use crate::admin::debug::StoreGauges;
use crate::clock::Timestamp;
use crate::cluster::ClusterStore;
use crate::cluster::lease::KeyView;
use crate::limiter::{Decision, Quota};
use crate::store::memcache::MemcacheConfig;
use crate::store::redis::{BreakerStats, RedisConfig};
use crate::store::{
    CounterStore, Hit, MemcacheStore, MemoryStore, RedisStore, StoreError, TraceBackend,
};
use crate::telemetry::prometheus::{
    BreakerGauges, ClusterGauges, MemoryGauges, ParentGauges, StoreReport,
};

/// Counter store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Counters in this process: limits apply per node, not across replicas.
    Memory,
    /// Counters in Redis, shared by every replica (and by envoyproxy/ratelimit instances).
    Redis(Box<RedisConfig>),
    /// Counters in memcached, shared likewise.
    Memcache(Box<MemcacheConfig>),
}

/// The store a running Sluice uses, chosen by BACKEND_TYPE.
pub enum AnyStore {
    Memory(MemoryStore),
    Redis(RedisStore),
    Memcache(MemcacheStore),
    /// Counters spread over peers, this node's share in a memory store.
    Cluster(ClusterStore),
}

impl AnyStore {
    /// Whether the backend can take requests (Redis: has answered its start-up PING and,
    /// with REDIS_HEALTH_CHECK_ACTIVE_CONNECTION, is not down; memcached: every server of the
    /// start-up list has answered).
    pub fn is_ready(&self) -> bool {
        match self {
            AnyStore::Memory(_) | AnyStore::Cluster(_) => true,
            AnyStore::Redis(r) => r.is_ready(),
            AnyStore::Memcache(m) => m.is_ready(),
        }
    }

    /// [`AnyStore::is_ready`], pushed at the instant it changes. For a backend that is always
    /// ready the value is `true` and `changed()` fails at once: it will never change.
    pub fn ready_changes(&self) -> tokio::sync::watch::Receiver<bool> {
        match self {
            AnyStore::Redis(r) => r.ready_changes(),
            AnyStore::Memcache(m) => m.ready_changes(),
            AnyStore::Memory(_) | AnyStore::Cluster(_) => tokio::sync::watch::channel(true).1,
        }
    }

    /// Completes, with the reason, when the backend gave up for good (Redis not answering
    /// within REDIS_STARTUP_MAX_ELAPSED_TIME); never for the other backends.
    pub fn gave_up(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = String> + Send>> {
        match self {
            AnyStore::Redis(r) => Box::pin(r.gave_up()),
            AnyStore::Memory(_) | AnyStore::Memcache(_) | AnyStore::Cluster(_) => {
                Box::pin(std::future::pending())
            }
        }
    }
}

impl CounterStore for AnyStore {
    fn trace_backend(&self) -> Option<TraceBackend> {
        match self {
            AnyStore::Memory(_) => None,
            // envoyproxy/ratelimit's name for its Redis span.
            AnyStore::Redis(_) => Some(TraceBackend {
                span_name: "Redis Pipeline Execution",
                attributes: &[("db.system", "redis"), ("sluice.backend", "redis")],
            }),
            // envoyproxy/ratelimit's name for its memcache span.
            AnyStore::Memcache(_) => Some(TraceBackend {
                span_name: "Memcached Fetch Execution",
                attributes: &[("db.system", "memcached"), ("sluice.backend", "memcache")],
            }),
            AnyStore::Cluster(_) => Some(TraceBackend {
                span_name: "Peer Cluster Apply",
                attributes: &[
                    ("rpc.system", "grpc"),
                    ("rpc.service", "sluice.peer.v1.Peer"),
                    ("sluice.backend", "cluster"),
                ],
            }),
        }
    }

    async fn apply<'a>(
        &'a self,
        now: Timestamp,
        hits: &'a [Hit<'a>],
        out: &'a mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(m) => m.apply(now, hits, out).await,
            AnyStore::Redis(r) => r.apply(now, hits, out).await,
            AnyStore::Memcache(m) => m.apply(now, hits, out).await,
            AnyStore::Cluster(c) => c.apply(now, hits, out).await,
        }
    }

    async fn refund<'a>(
        &'a self,
        now: Timestamp,
        hits: &'a [Hit<'a>],
        out: &'a mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(m) => m.refund(now, hits, out).await,
            AnyStore::Redis(r) => r.refund(now, hits, out).await,
            AnyStore::Memcache(m) => m.refund(now, hits, out).await,
            AnyStore::Cluster(c) => c.refund(now, hits, out).await,
        }
    }

    fn counts_refused(&self, quota: &Quota) -> bool {
        match self {
            AnyStore::Memory(m) => m.counts_refused(quota),
            AnyStore::Redis(r) => r.counts_refused(quota),
            AnyStore::Memcache(m) => m.counts_refused(quota),
            AnyStore::Cluster(c) => c.counts_refused(quota),
        }
    }

    async fn reset<'a>(&'a self, now: Timestamp, hits: &'a [Hit<'a>]) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(m) => m.reset(now, hits).await,
            AnyStore::Redis(r) => r.reset(now, hits).await,
            AnyStore::Memcache(m) => m.reset(now, hits).await,
            AnyStore::Cluster(c) => c.reset(now, hits).await,
        }
    }
}

/// What `/metrics`, statsd, OTLP and the status page read of the store: the chosen backend
/// reports itself ([`Reports`]).
impl StoreGauges for AnyStore {
    fn report(&self) -> StoreReport {
        let mut report = StoreReport::default();
        match self {
            AnyStore::Memory(m) => m.report(&mut report),
            AnyStore::Redis(r) => r.report(&mut report),
            AnyStore::Memcache(m) => m.report(&mut report),
            AnyStore::Cluster(c) => c.report(&mut report),
        }
        report
    }

    fn lease(&self, key: &str) -> Option<KeyView> {
        let AnyStore::Cluster(c) = self else {
            return None;
        };
        c.lease_view(key)
    }
}

/// One backend's part of a [`StoreReport`]: each fills the parts that are its own.
trait Reports {
    fn report(&self, into: &mut StoreReport);
}

impl Reports for MemoryStore {
    fn report(&self, into: &mut StoreReport) {
        into.memory = Some(MemoryGauges {
            live_counters: self.live_counters() as u64,
            max_counters: self.max_counters() as u64,
            counter_bytes: self.counter_bytes() as u64,
            max_counter_bytes: self.limits().max_bytes as u64,
            rejected_full: self.stats().rejected_full.load(Ordering::Relaxed),
            swept: self.stats().swept.load(Ordering::Relaxed),
            penalties_dropped: self.stats().penalties_dropped.load(Ordering::Relaxed),
        });
    }
}

impl Reports for RedisStore {
    fn report(&self, into: &mut StoreReport) {
        into.redis = self
            .breakers()
            .into_iter()
            .map(|b| breaker_gauges(b.target.to_owned(), b))
            .collect();
        into.allowance = self.allowance_stats();
    }
}

impl Reports for MemcacheStore {
    fn report(&self, into: &mut StoreReport) {
        into.memcache = self
            .breakers()
            .into_iter()
            .map(|(server, b)| breaker_gauges(server, b))
            .collect();
    }
}

/// The peer cluster: its local memory store, its own numbers and its write-behind's Redis.
impl Reports for ClusterStore {
    fn report(&self, into: &mut StoreReport) {
        self.local().report(into);
        let durable = self.owner().durable();
        into.redis = durable
            .map(|d| {
                let b = d.redis_breaker();
                breaker_gauges(b.target.to_owned(), b)
            })
            .into_iter()
            .collect();
        let cs = self.stats();
        into.cluster = Some(ClusterGauges {
            local_hits: cs.local_hits.load(Ordering::Relaxed),
            forwarded_hits: cs.forwarded_hits.load(Ordering::Relaxed),
            peer_calls: cs.peer_calls.load(Ordering::Relaxed),
            failed_forwards: cs.failed_forwards.load(Ordering::Relaxed),
            alone_hits: cs.alone_hits.load(Ordering::Relaxed),
            majority: self.has_majority(),
            relayed_hits: cs.relayed_hits.load(Ordering::Relaxed),
            failed_relays: cs.failed_relays.load(Ordering::Relaxed),
            taken_over: cs.taken_over.load(Ordering::Relaxed),
            joining: self.joining(),
            durable: durable.map(|d| d.stats().snapshot()).unwrap_or_default(),
            peers: self.peers(),
            lease: self.lease_stats(),
            parent: self.owner().parent().map(|p| {
                let state = p.upstream.state();
                ParentGauges {
                    peers: p.peers(),
                    reached: state.reached,
                    unreachable: state.unreachable,
                    clusters: state.clusters,
                    expected: state.expected,
                }
            }),
        });
    }
}

fn breaker_gauges(target: String, b: BreakerStats) -> BreakerGauges {
    BreakerGauges {
        target,
        up: b.up,
        opens: b.opens,
        fast_failures: b.fast_failures,
    }
}
