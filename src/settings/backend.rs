//! BACKEND_TYPE: which counter store serves (memory, Redis or memcached), built into the app's
//! [`Backend`] from the Redis ([`super::redis`]) and memcache ([`super::memcache`]) settings,
//! and the peer cluster beside it, or in its place.

use std::net::SocketAddr;

use super::{MemcacheArgs, RedisArgs, ServeArgs, SettingsError, invalid};
use crate::app::Backend;
use crate::cluster::ClusterConfig;

/// Where counts are kept: the backend, and the peer cluster when there is one.
pub(super) struct CounterStore {
    pub(super) backend: Backend,
    pub(super) cluster: Option<ClusterConfig>,
}

/// The counter store, and the peer cluster (binding where the gRPC listener does).
pub(super) fn counter_store(
    args: &ServeArgs,
    grpc: SocketAddr,
) -> Result<CounterStore, SettingsError> {
    let cluster = args.cluster.validate()?;
    let mut write_behind = args.cluster.write_behind(
        args.backend_type.as_deref(),
        &args.redis,
        cluster.as_ref(),
        args.cache_key_prefix.as_deref().unwrap_or_default(),
    )?;
    let mut backend = match write_behind {
        // The cluster counts in memory; Redis only keeps the write-behind copy.
        Some(_) => Backend::Memory,
        None => backend(
            args.backend_type.as_deref(),
            args.redis.clone(),
            &args.memcache,
        )?,
    };
    args.redis_breaker
        .apply(&mut backend, write_behind.as_mut())?;
    if let (Backend::Redis(_) | Backend::Memcache(_), Some(_)) = (&backend, &cluster) {
        return Err(args.cluster.peers_beside_shared_backend(&backend));
    }
    let cluster = cluster.map(|mut c| {
        // The peer listener binds where the gRPC listener does.
        c.listen = SocketAddr::new(grpc.ip(), args.cluster.peer_port);
        c.write_behind = write_behind;
        c
    });
    Ok(CounterStore { backend, cluster })
}

/// A memory backend counts per node. Where the operator configured Redis (REDIS_URL without
/// BACKEND_TYPE, as envoyproxy/ratelimit deployments do) Sluice uses Redis: falling back to
/// memory would multiply every limit by the replica count without a word.
fn backend(
    backend_type: Option<&str>,
    redis: RedisArgs,
    memcache: &MemcacheArgs,
) -> Result<Backend, SettingsError> {
    let kind = match backend_type {
        Some(v) => v.to_ascii_lowercase(),
        None if redis.redis_url.is_some() => "redis".to_owned(),
        None => "memory".to_owned(),
    };
    match kind.as_str() {
        "memory" => Ok(Backend::Memory),
        "redis" => redis.validate().map(|r| Backend::Redis(Box::new(r))),
        "memcache" => memcache
            .validate(&redis)
            .map(|m| Backend::Memcache(Box::new(m))),
        _ => Err(invalid(
            "BACKEND_TYPE",
            kind,
            "unknown backend; expected memory, redis or memcache",
        )),
    }
}
