//! What every connection to Redis shares, whatever the topology: where a Redis is
//! ([`RedisTarget`], [`RedisTopology`]), its TLS material ([`RedisTls`]), the start-up retry
//! schedule, and the one way a client is made. The store ([`super::redis`]), a target's
//! supervisor ([`super::redis_target`]) and the Sentinel watcher ([`super::redis_sentinel`]) all
//! use it, and it uses none of them, so they never import each other in a circle.

use std::fmt;
use std::time::Duration;

use redis::RedisError;

/// Where one Redis is and how to reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisTarget {
    /// `redis://`, `rediss://` or `redis+unix://` URLs, credentials included: the one Redis, a
    /// cluster's seeds, or the sentinels (with REDIS_SENTINEL_AUTH's credentials).
    pub urls: Vec<String>,
    pub topology: RedisTopology,
    /// REDIS_TLS (REDIS_PERSECOND_TLS): TLS to every node of this target, sentinels included.
    pub tls: Option<RedisTls>,
}

impl RedisTarget {
    /// One Redis without TLS at a `redis://` or `redis+unix://` URL.
    pub fn single(url: impl Into<String>) -> Self {
        RedisTarget {
            urls: vec![url.into()],
            topology: RedisTopology::Single,
            tls: None,
        }
    }
}

/// REDIS_TYPE.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisTopology {
    Single,
    Cluster,
    /// The target's URLs are sentinels; the master they name for `master_name` is looked up at
    /// start and again whenever it fails or stops being a master.
    Sentinel {
        master_name: String,
        /// REDIS_AUTH, for the master: `user:password@`, `:password@` (percent-encoded) or "".
        master_userinfo: String,
    },
}

/// The REDIS_TLS_* files, read and checked before any port is bound.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisTls {
    /// REDIS_TLS_CACERT (PEM): the only roots trusted. `None`: the system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY (PEM), presented to Redis.
    pub client_pem: Option<(Vec<u8>, Vec<u8>)>,
    /// REDIS_TLS_SKIP_HOSTNAME_VERIFICATION: the chain is verified, the name is not.
    pub skip_hostname_verification: bool,
}

impl fmt::Debug for RedisTls {
    /// Never prints a private key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTls")
            .field("ca", &self.ca_pem.as_ref().map(|_| "<pem>"))
            .field("client", &self.client_pem.as_ref().map(|_| "<pem>"))
            .field(
                "skip_hostname_verification",
                &self.skip_hostname_verification,
            )
            .finish()
    }
}

/// The start-up PING's retry schedule: `initial`, doubling up to `max`; with `max_elapsed`,
/// Sluice exits once Redis has not answered for that long (envoyproxy/ratelimit gives up too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StartupBackoff {
    pub initial: Duration,
    pub max: Duration,
    /// `None`: retry forever (REDIS_STARTUP_MAX_ELAPSED_TIME=0, the default).
    pub max_elapsed: Option<Duration>,
}

impl Default for StartupBackoff {
    fn default() -> Self {
        StartupBackoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(30),
            max_elapsed: None,
        }
    }
}

/// A client for one node at `url`; with `tls`, the URL is `rediss://` and the REDIS_TLS_*
/// certificates apply.
pub fn client(url: &str, tls: Option<&RedisTls>) -> Result<redis::Client, RedisError> {
    let Some(tls) = tls else {
        return redis::Client::open(url);
    };
    let client = redis::Client::build_with_tls(url, certificates(tls))?;
    if !tls.skip_hostname_verification {
        return Ok(client);
    }
    // The chain is still verified against the roots; only a name mismatch is accepted.
    let info = client.get_connection_info().clone();
    let mut addr = info.addr().clone();
    addr.set_danger_accept_invalid_hostnames(true);
    redis::Client::open(info.set_addr(addr))
}

/// `url` with its userinfo and `pass`/`user` query replaced by `***`.
pub fn without_credentials(url: &str) -> String {
    let url = match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    };
    match url.split_once('?') {
        Some((path, _)) => format!("{path}?***"),
        None => url,
    }
}

pub fn certificates(tls: &RedisTls) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: tls
            .client_pem
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: tls.ca_pem.clone(),
    }
}
