//! What every connection to Redis shares, whatever the topology: where a Redis is
//! ([`RedisTarget`], its [`RedisNode`]s and their [`RedisAddress`], [`RedisTopology`]), whom
//! Sluice is there ([`Auth`], [`Credentials`]), its TLS material ([`RedisTls`]), the start-up
//! retry schedule, and the one place redis-rs's connection info is built from them
//! ([`connection_info`], [`client`]). The settings build these types from the Go service's
//! variables and never see redis-rs; redis-rs's URLs and `ConnectionInfo` stay in here.
//!
//! The store ([`super::redis`]), a target's supervisor ([`super::redis_target`]) and the
//! Sentinel watcher ([`super::redis_sentinel`]) all use it, and it uses none of them, so they
//! never import each other in a circle.

use std::fmt;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use redis::{
    ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisConnectionInfo, RedisError,
};

use crate::secret::Secret;

/// Where one Redis server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisAddress {
    /// A host name or an IP address (IPv6 without brackets), and a port.
    Tcp { host: String, port: u16 },
    /// A unix socket's path (REDIS_SOCKET_TYPE=unix).
    Unix(PathBuf),
}

/// One Redis server: where it is, whom Sluice is there and which database it uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisNode {
    pub address: RedisAddress,
    /// REDIS_AUTH (REDIS_SENTINEL_AUTH for a sentinel), or the credentials of a URL in
    /// REDIS_URL; `None`: no AUTH. A credentials file ([`Credentials::File`]) wins over them.
    pub auth: Option<Auth>,
    /// The database a `redis://host:port/N` URL names; 0 otherwise.
    pub db: i64,
}

impl RedisNode {
    /// A Redis at `host:port`, database 0, without AUTH.
    pub fn tcp(host: impl Into<String>, port: u16) -> Self {
        RedisNode {
            address: RedisAddress::Tcp {
                host: host.into(),
                port,
            },
            auth: None,
            db: 0,
        }
    }

    /// How logs, errors and the breaker name the node: `redis://host:port` (`rediss://` over
    /// TLS) or `redis+unix:///path`, never with its credentials.
    pub fn name(&self, tls: bool) -> String {
        let db = match self.db {
            0 => String::new(),
            n => format!("/{n}"),
        };
        match &self.address {
            RedisAddress::Tcp { host, port } => {
                let scheme = if tls { "rediss" } else { "redis" };
                if host.contains(':') {
                    format!("{scheme}://[{host}]:{port}{db}")
                } else {
                    format!("{scheme}://{host}:{port}{db}")
                }
            }
            RedisAddress::Unix(path) => format!("redis+unix://{}", path.display()),
        }
    }
}

/// Where one Redis is and how to reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisTarget {
    /// The one Redis, a cluster's seeds, or the sentinels (with REDIS_SENTINEL_AUTH's
    /// credentials).
    pub nodes: Vec<RedisNode>,
    /// Where the nodes' credentials come from: fixed in each node, or a file read for each new
    /// connection (REDIS_AUTH_FILE; REDIS_SENTINEL_AUTH_FILE for sentinels).
    pub credentials: Credentials,
    pub topology: RedisTopology,
    /// REDIS_TLS (REDIS_PERSECOND_TLS): TLS to every node of this target, sentinels included.
    pub tls: Option<RedisTls>,
}

impl RedisTarget {
    /// One Redis without TLS.
    pub fn single(node: RedisNode) -> Self {
        RedisTarget {
            nodes: vec![node],
            credentials: Credentials::Fixed,
            topology: RedisTopology::Single,
            tls: None,
        }
    }
}

/// Where a Redis connection's `user:password` comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Credentials {
    /// Each node's own ([`RedisNode::auth`]: REDIS_AUTH or a URL's, fixed at start), if any.
    #[default]
    Fixed,
    /// A file holding `password` or `user:password` (REDIS_AUTH_FILE), read again for every new
    /// connection: a rotated Kubernetes Secret or IAM token is used from the next connection
    /// on, without a restart. Connections already made stay as they are.
    File(PathBuf),
}

/// The most a credentials file may hold.
pub(crate) const MAX_CREDENTIALS_FILE_BYTES: u64 = 4096;

/// A password, and the ACL user it belongs to (Redis's `default` when `None`). The password is
/// a [`Secret`]: it never shows in debug output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Auth {
    pub username: Option<String>,
    pub password: Secret,
}

impl Credentials {
    /// The file's credentials as they are now; `None` when they are fixed in the nodes.
    pub fn current(&self) -> Result<Option<Auth>, RedisError> {
        match self {
            Credentials::Fixed => Ok(None),
            Credentials::File(path) => read_credentials(path).map(Some).map_err(|message| {
                RedisError::from((ErrorKind::AuthenticationFailed, "credentials file", message))
            }),
        }
    }
}

/// Reads a credentials file: `password` or `user:password` (split at the first `:`, as
/// REDIS_AUTH is), one trailing line break allowed; at most [`MAX_CREDENTIALS_FILE_BYTES`].
pub(crate) fn read_credentials(path: &Path) -> Result<Auth, String> {
    let shown = path.display();
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open {shown}: {e}"))?;
    let mut text = String::new();
    file.take(MAX_CREDENTIALS_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read {shown} as UTF-8 text: {e}"))?;
    if text.len() as u64 > MAX_CREDENTIALS_FILE_BYTES {
        return Err(format!(
            "{shown} is over {MAX_CREDENTIALS_FILE_BYTES} bytes: not a password file"
        ));
    }
    let value = text
        .strip_suffix('\n')
        .map_or(text.as_str(), |t| t.strip_suffix('\r').unwrap_or(t));
    if value.is_empty() {
        return Err(format!("{shown} is empty"));
    }
    Ok(match value.split_once(':') {
        Some((user, password)) => Auth {
            username: Some(user.to_owned()).filter(|u| !u.is_empty()),
            password: Secret::new(password),
        },
        None => Auth {
            username: None,
            password: Secret::new(value),
        },
    })
}

/// REDIS_TYPE.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisTopology {
    Single,
    Cluster,
    /// The target's nodes are sentinels; the master they name for `master_name` is looked up
    /// at start and again whenever it fails or stops being a master.
    Sentinel {
        master_name: String,
        /// REDIS_AUTH, for the master; `None`: no AUTH.
        master_auth: Option<Auth>,
        /// REDIS_AUTH_FILE, for the master, when set (then `master_auth` is `None`).
        master_credentials: Credentials,
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

/// A client for `node` with the target's `credentials` (a file's read now, else the node's
/// own); with `tls`, over TLS with the REDIS_TLS_* certificates.
pub(super) fn client_with(
    node: &RedisNode,
    tls: Option<&RedisTls>,
    credentials: &Credentials,
) -> Result<redis::Client, RedisError> {
    let from_file = credentials.current()?;
    client(node, from_file.as_ref().or(node.auth.as_ref()), tls)
}

/// A client for `node` with `auth`; with `tls`, over TLS with the REDIS_TLS_* certificates.
pub(super) fn client(
    node: &RedisNode,
    auth: Option<&Auth>,
    tls: Option<&RedisTls>,
) -> Result<redis::Client, RedisError> {
    let info = connection_info(node, auth, tls.is_some())?;
    let Some(tls) = tls else {
        return redis::Client::open(info);
    };
    let client = redis::Client::build_with_tls(info, certificates(tls))?;
    if !tls.skip_hostname_verification {
        return Ok(client);
    }
    // The chain is still verified against the roots; only a name mismatch is accepted.
    let info = client.get_connection_info().clone();
    let mut addr = info.addr().clone();
    addr.set_danger_accept_invalid_hostnames(true);
    redis::Client::open(info.set_addr(addr))
}

/// What redis-rs needs to reach `node`: its address (over TLS with `tls`; the certificates are
/// the caller's to add), its database and, with `auth`, the AUTH to send. RESP2, as before.
pub(super) fn connection_info(
    node: &RedisNode,
    auth: Option<&Auth>,
    tls: bool,
) -> Result<ConnectionInfo, RedisError> {
    let addr = match &node.address {
        RedisAddress::Tcp { host, port } if tls => ConnectionAddr::TcpTls {
            host: host.clone(),
            port: *port,
            insecure: false,
            tls_params: None,
        },
        RedisAddress::Tcp { host, port } => ConnectionAddr::Tcp(host.clone(), *port),
        RedisAddress::Unix(path) => ConnectionAddr::Unix(path.clone()),
    };
    let mut redis = RedisConnectionInfo::default().set_db(node.db);
    if let Some(auth) = auth {
        redis = redis.set_password(auth.password.expose());
        if let Some(user) = &auth.username {
            redis = redis.set_username(user);
        }
    }
    Ok(addr.into_connection_info()?.set_redis_settings(redis))
}

pub(super) fn certificates(tls: &RedisTls) -> redis::TlsCertificates {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &[u8]) -> Result<Auth, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auth");
        std::fs::write(&path, text).unwrap();
        read_credentials(&path)
    }

    #[test]
    fn credentials_files_hold_a_password_or_user_and_password() {
        let auth = |user: Option<&str>, password: &str| Auth {
            username: user.map(str::to_owned),
            password: Secret::new(password),
        };
        assert_eq!(read(b"p4ss"), Ok(auth(None, "p4ss")));
        // One line break, as `echo` and most Secret tools leave, is not part of it.
        assert_eq!(read(b"p4ss\n"), Ok(auth(None, "p4ss")));
        assert_eq!(read(b"p4ss\r\n"), Ok(auth(None, "p4ss")));
        assert_eq!(read(b" p4ss \n\n"), Ok(auth(None, " p4ss \n")));
        assert_eq!(read(b"user:pa:ss"), Ok(auth(Some("user"), "pa:ss")));
        assert_eq!(read(b":pass"), Ok(auth(None, "pass")));
        assert!(read(b"").unwrap_err().ends_with("is empty"));
        assert!(read(b"\n").unwrap_err().ends_with("is empty"));
        let big = vec![b'x'; MAX_CREDENTIALS_FILE_BYTES as usize + 1];
        assert!(read(&big).unwrap_err().contains("is over 4096 bytes"));
        assert!(read(b"\xff\xfe").unwrap_err().contains("as UTF-8 text"));
        assert!(format!("{:?}", auth(Some("u"), "hunter2")).contains("<redacted>"));
        assert!(!format!("{:?}", auth(Some("u"), "hunter2")).contains("hunter2"));
    }

    fn node(address: RedisAddress, auth: Option<(Option<&str>, &str)>, db: i64) -> RedisNode {
        RedisNode {
            address,
            auth: auth.map(|(user, password)| Auth {
                username: user.map(str::to_owned),
                password: Secret::new(password),
            }),
            db,
        }
    }

    fn tcp(host: &str, port: u16) -> RedisAddress {
        RedisAddress::Tcp {
            host: host.to_owned(),
            port,
        }
    }

    /// The typed nodes the settings make reach what the URLs the settings used to format did,
    /// as redis-rs's own URL parser reads those URLs: the same address, TLS or not, user,
    /// password and database.
    #[test]
    fn nodes_connect_where_their_old_urls_did() {
        let unix = || RedisAddress::Unix(PathBuf::from("/run/redis.sock"));
        let cases = [
            (
                node(tcp("127.0.0.1", 6379), None, 0),
                false,
                "redis://127.0.0.1:6379",
            ),
            (
                node(tcp("127.0.0.1", 6379), Some((Some("user"), "p@ss")), 0),
                false,
                "redis://user:p%40ss@127.0.0.1:6379",
            ),
            (
                node(tcp("10.0.0.1", 26379), Some((Some("admin"), "s3nt/nel")), 0),
                false,
                "redis://admin:s3nt%2Fnel@10.0.0.1:26379",
            ),
            (
                node(tcp("127.0.0.1", 26379), Some((None, "sp")), 0),
                false,
                "redis://:sp@127.0.0.1:26379",
            ),
            (
                node(tcp("::1", 6379), None, 2),
                false,
                "redis://[::1]:6379/2",
            ),
            (
                node(tcp("127.0.0.1", 6380), None, 0),
                true,
                "rediss://127.0.0.1:6380",
            ),
            (
                node(tcp("10.0.0.1", 6380), Some((None, "pw")), 0),
                true,
                "rediss://:pw@10.0.0.1:6380",
            ),
            (node(unix(), None, 0), false, "redis+unix:///run/redis.sock"),
            (
                node(unix(), Some((Some("u"), "p&q")), 0),
                false,
                "redis+unix:///run/redis.sock?user=u&pass=p%26q",
            ),
        ];
        for (node, tls, url) in cases {
            let typed = connection_info(&node, node.auth.as_ref(), tls).unwrap();
            let parsed = url.into_connection_info().unwrap();
            assert_eq!(typed.addr(), parsed.addr(), "{url}");
            let (t, p) = (typed.redis_settings(), parsed.redis_settings());
            assert_eq!(t.username(), p.username(), "{url}");
            assert_eq!(t.password(), p.password(), "{url}");
            assert_eq!(t.db(), p.db(), "{url}");
            assert_eq!(t.protocol(), p.protocol(), "{url}");
        }
    }

    /// The breaker, the logs and the status page name a node as its old URL did, less the
    /// credentials (which used to show as `***`).
    #[test]
    fn nodes_are_named_like_urls_without_credentials() {
        let secret = Some((Some("user"), "hunter2"));
        assert_eq!(
            node(tcp("10.0.0.5", 6379), secret, 0).name(false),
            "redis://10.0.0.5:6379"
        );
        assert_eq!(
            node(tcp("::1", 6380), None, 3).name(true),
            "rediss://[::1]:6380/3"
        );
        assert_eq!(
            node(RedisAddress::Unix("/run/redis.sock".into()), secret, 0).name(false),
            "redis+unix:///run/redis.sock"
        );
        let debug = format!("{:?}", node(tcp("h", 1), secret, 0));
        assert!(!debug.contains("hunter2"), "{debug}");
    }

    /// A credentials file wins over the node's own credentials, whole.
    #[test]
    fn a_credentials_file_wins_over_the_nodes_own() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auth");
        std::fs::write(&path, "rotated\n").unwrap();
        let n = node(tcp("127.0.0.1", 6379), Some((Some("user"), "fixed")), 0);
        let info = |credentials: &Credentials| {
            client_with(&n, None, credentials)
                .unwrap()
                .get_connection_info()
                .redis_settings()
                .clone()
        };
        let fixed = info(&Credentials::Fixed);
        assert_eq!(
            (fixed.username(), fixed.password()),
            (Some("user"), Some("fixed"))
        );
        let from_file = info(&Credentials::File(path));
        assert_eq!(
            (from_file.username(), from_file.password()),
            (None, Some("rotated"))
        );
    }
}
