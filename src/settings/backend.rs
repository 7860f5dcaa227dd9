//! BACKEND_TYPE: which counter store serves (memory, Redis or memcached), built into the app's
//! [`Backend`] from the Redis ([`super::redis`]) and memcache ([`super::memcache`]) settings.

use super::{MemcacheArgs, RedisArgs, SettingsError, invalid};
use crate::app::Backend;

/// A memory backend counts per node. Where the operator configured Redis (REDIS_URL without
/// BACKEND_TYPE, as envoyproxy/ratelimit deployments do) Sluice uses Redis: falling back to
/// memory would multiply every limit by the replica count without a word.
pub(super) fn backend(
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
