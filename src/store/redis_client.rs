//! What every connection to Redis shares, whatever the topology: where a Redis is
//! ([`RedisTarget`], [`RedisTopology`]), its TLS material ([`RedisTls`]), the start-up retry
//! schedule, and the one way a client is made. The store ([`super::redis`]), a target's
//! supervisor ([`super::redis_target`]) and the Sentinel watcher ([`super::redis_sentinel`]) all
//! use it, and it uses none of them, so they never import each other in a circle.

use std::fmt;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use redis::{ErrorKind, RedisError};

/// Where one Redis is and how to reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisTarget {
    /// `redis://`, `rediss://` or `redis+unix://` URLs, credentials included unless they come
    /// from a file: the one Redis, a cluster's seeds, or the sentinels (with
    /// REDIS_SENTINEL_AUTH's credentials).
    pub urls: Vec<String>,
    /// The credentials of the nodes `urls` name: in the URLs, or a file read for each new
    /// connection (REDIS_AUTH_FILE; REDIS_SENTINEL_AUTH_FILE for sentinels).
    pub credentials: Credentials,
    pub topology: RedisTopology,
    /// REDIS_TLS (REDIS_PERSECOND_TLS): TLS to every node of this target, sentinels included.
    pub tls: Option<RedisTls>,
}

impl RedisTarget {
    /// One Redis without TLS at a `redis://` or `redis+unix://` URL.
    pub fn single(url: impl Into<String>) -> Self {
        RedisTarget {
            urls: vec![url.into()],
            credentials: Credentials::InUrls,
            topology: RedisTopology::Single,
            tls: None,
        }
    }
}

/// Where a Redis connection's `user:password` comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Credentials {
    /// In the URLs (REDIS_AUTH, fixed at start), or none.
    #[default]
    InUrls,
    /// A file holding `password` or `user:password` (REDIS_AUTH_FILE), read again for every new
    /// connection: a rotated Kubernetes Secret or IAM token is used from the next connection
    /// on, without a restart. Connections already made stay as they are.
    File(PathBuf),
}

/// The most a credentials file may hold.
pub const MAX_CREDENTIALS_FILE_BYTES: u64 = 4096;

/// A password, and the ACL user it belongs to (Redis's `default` when `None`).
#[derive(Clone, PartialEq, Eq)]
pub struct Auth {
    pub username: Option<String>,
    pub password: String,
}

impl fmt::Debug for Auth {
    /// Never prints the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl Credentials {
    /// The file's credentials as they are now; `None` when they are in the URLs.
    pub fn current(&self) -> Result<Option<Auth>, RedisError> {
        match self {
            Credentials::InUrls => Ok(None),
            Credentials::File(path) => read_credentials(path).map(Some).map_err(|message| {
                RedisError::from((ErrorKind::AuthenticationFailed, "credentials file", message))
            }),
        }
    }
}

/// Reads a credentials file: `password` or `user:password` (split at the first `:`, as
/// REDIS_AUTH is), one trailing line break allowed; at most [`MAX_CREDENTIALS_FILE_BYTES`].
pub fn read_credentials(path: &Path) -> Result<Auth, String> {
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
            password: password.to_owned(),
        },
        None => Auth {
            username: None,
            password: value.to_owned(),
        },
    })
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
        /// REDIS_AUTH_FILE, for the master, when set (then `master_userinfo` is "").
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

/// A client for one node at `url` with `credentials` (read now, when from a file); with `tls`,
/// the URL is `rediss://` and the REDIS_TLS_* certificates apply.
pub fn client_with(
    url: &str,
    tls: Option<&RedisTls>,
    credentials: &Credentials,
) -> Result<redis::Client, RedisError> {
    let client = client(url, tls)?;
    let Some(auth) = credentials.current()? else {
        return Ok(client);
    };
    let info = client.get_connection_info().clone();
    let mut settings = info.redis_settings().clone().set_password(auth.password);
    if let Some(user) = auth.username {
        settings = settings.set_username(user);
    }
    redis::Client::open(info.set_redis_settings(settings))
}

/// A client for one node at `url`, credentials as the URL has them; with `tls`, the URL is
/// `rediss://` and the REDIS_TLS_* certificates apply.
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
            password: password.to_owned(),
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
}
