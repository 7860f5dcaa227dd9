//! One item of REDIS_URL (REDIS_PERSECOND_URL) into the store's typed [`RedisNode`]: where
//! the Redis is, with REDIS_AUTH's credentials, in the forms the Go service's users write:
//!
//! - `host:port` (`[v6]:port`), with REDIS_AUTH;
//! - a socket path, under REDIS_SOCKET_TYPE=unix, with REDIS_AUTH;
//! - `redis://[user:password@]host[:port][/db]` (`rediss://` needs REDIS_TLS), whose own
//!   credentials (percent-encoded) are the only ones it uses, as before;
//! - `redis+unix:///path[?user=..&pass=..&db=..]` (or `unix://`), likewise.
//!
//! Everything is checked here, before start-up: the stores only turn nodes into their client's
//! connection settings. Credentials are decoded by the one strict percent-decoder
//! ([`crate::percent`]) and kept as a [`Secret`].

use std::path::PathBuf;

use super::{SettingsError, invalid};
use crate::secret::Secret;
use crate::store::redis::{Auth, RedisAddress, RedisNode};

/// redis-rs's port when a URL gives none.
const DEFAULT_PORT: u16 = 6379;

/// REDIS_AUTH's value, `password` or `user:password` (split at the first `:`); an empty
/// password means no AUTH, as an empty one in a URL did.
pub(super) fn auth(value: &str) -> Option<Auth> {
    let (user, password) = match value.split_once(':') {
        Some((user, password)) => (Some(user).filter(|u| !u.is_empty()), password),
        None => (None, value),
    };
    (!password.is_empty()).then(|| Auth {
        username: user.map(str::to_owned),
        password: Secret::new(password),
    })
}

/// How the items of one REDIS_URL become nodes.
pub(super) struct NodeSyntax<'a> {
    pub url_var: &'static str,
    pub socket_var: &'static str,
    pub tls_var: &'static str,
    /// REDIS_TLS (REDIS_PERSECOND_TLS) is on.
    pub tls: bool,
    /// REDIS_SOCKET_TYPE=unix, for a single Redis: a bare item is a socket path.
    pub unix: bool,
    /// The credentials of the items that are not URLs: REDIS_AUTH, or REDIS_SENTINEL_AUTH for
    /// sentinels.
    pub auth: Option<&'a Auth>,
}

impl NodeSyntax<'_> {
    /// One item, checked.
    pub(super) fn node(&self, item: &str) -> Result<RedisNode, SettingsError> {
        let (url_var, tls_var) = (self.url_var, self.tls_var);
        if let Some(rest) = item.strip_prefix("redis://") {
            self.tcp_url(item, rest)
        } else if let Some(rest) = item.strip_prefix("rediss://") {
            if self.tls {
                self.tcp_url(item, rest)
            } else {
                Err(invalid(
                    url_var,
                    item,
                    format!("a rediss:// URL needs {tls_var}=true (and its REDIS_TLS_* files)"),
                ))
            }
        } else if let Some(rest) = item
            .strip_prefix("redis+unix://")
            .or_else(|| item.strip_prefix("unix://"))
        {
            self.no_tls(item)?;
            unix_url(rest).map_err(|reason| invalid(url_var, item, reason))
        } else if self.unix {
            self.no_tls(item)?;
            Ok(RedisNode {
                address: RedisAddress::Unix(PathBuf::from(item)),
                auth: self.auth.cloned(),
                db: 0,
            })
        } else if item.contains(':') {
            tcp_location(item, self.auth.cloned())
                .map_err(|_| invalid(url_var, item, "expected host:port"))
        } else {
            Err(invalid(url_var, item, "expected host:port"))
        }
    }

    /// A `redis://` or `rediss://` URL's part after the scheme: its own credentials only.
    fn tcp_url(&self, item: &str, rest: &str) -> Result<RedisNode, SettingsError> {
        let parsed = match rest.rsplit_once('@') {
            Some((userinfo, location)) => {
                url_auth(userinfo).and_then(|auth| tcp_location(location, auth))
            }
            None => tcp_location(rest, None),
        };
        parsed.map_err(|reason| {
            invalid(
                self.url_var,
                item,
                format!("expected redis://[user:password@]host[:port][/database]: {reason}"),
            )
        })
    }

    fn no_tls(&self, item: &str) -> Result<(), SettingsError> {
        if !self.tls {
            return Ok(());
        }
        Err(invalid(
            self.url_var,
            item,
            format!(
                "{}=true needs a TCP address ({}=tcp): Redis serves TLS on TCP only",
                self.tls_var, self.socket_var
            ),
        ))
    }
}

/// `host[:port][/db]`, the host a name or an IP address (IPv6 in brackets): the node reached
/// there with `auth`.
fn tcp_location(location: &str, auth: Option<Auth>) -> Result<RedisNode, String> {
    if location.contains(['?', '#']) {
        return Err("a query (?...) or fragment (#...) is not supported".to_owned());
    }
    let (host_port, db) = match location.split_once('/') {
        Some((host_port, path)) => (host_port, database(path)?),
        None => (location, 0),
    };
    let (host, port) = match host_port.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6.split_once(']').ok_or("no ] after an IPv6 address")?;
            match after {
                "" => (host, None),
                _ => (host, Some(after.strip_prefix(':').ok_or("expected :port")?)),
            }
        }
        None => match host_port.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        },
    };
    if host.is_empty() {
        return Err("no host".to_owned());
    }
    if host == "0.0.0.0" || host == "::" {
        return Err("cannot connect to a wildcard address (0.0.0.0 or ::)".to_owned());
    }
    let port = match port {
        None | Some("") => DEFAULT_PORT,
        Some(port) => port
            .parse()
            .map_err(|_| format!("the port {port:?} is not a number up to 65535"))?,
    };
    let address = RedisAddress::Tcp {
        host: host.to_owned(),
        port,
    };
    Ok(RedisNode { address, auth, db })
}

/// A URL's database: its path (`/2`), or the `db` query parameter of a socket URL.
fn database(text: &str) -> Result<i64, String> {
    match text.trim_matches('/') {
        "" => Ok(0),
        n => n
            .parse()
            .map_err(|_| format!("{n:?} is not a database number")),
    }
}

/// A URL's `user:password` (either part percent-encoded); no password means no AUTH.
fn url_auth(userinfo: &str) -> Result<Option<Auth>, String> {
    let (user, password) = match userinfo.split_once(':') {
        Some((user, password)) => (decode(user)?, decode(password)?),
        None => (decode(userinfo)?, String::new()),
    };
    Ok((!password.is_empty()).then(|| Auth {
        username: Some(user).filter(|u| !u.is_empty()),
        password: Secret::new(password),
    }))
}

fn decode(text: &str) -> Result<String, String> {
    crate::percent::decode(text.as_bytes()).ok_or_else(|| {
        "the credentials are not valid percent-encoded UTF-8 (a % takes two hex digits)".to_owned()
    })
}

/// A `redis+unix://` URL's part after the scheme: `/path` (or `localhost/path`), then
/// `user`, `pass` and `db` as query parameters, percent-encoded.
fn unix_url(rest: &str) -> Result<RedisNode, String> {
    let expected = "expected redis+unix:///path/to/socket[?user=..&pass=..&db=..]";
    if rest.contains('#') {
        return Err(format!("{expected}: a fragment (#...) is not supported"));
    }
    let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
    let path = match location.strip_prefix("localhost") {
        Some(path) if path.starts_with('/') => path,
        _ if location.starts_with('/') => location,
        _ => return Err(format!("{expected}: the path must be absolute")),
    };
    let path = crate::percent::decode(path.as_bytes())
        .ok_or_else(|| format!("{expected}: the path is not valid percent-encoded UTF-8"))?;
    let (mut user, mut password, mut db) = (String::new(), String::new(), 0);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "user" => user = decode(value)?,
            "pass" => password = decode(value)?,
            "db" => db = database(value)?,
            _ => return Err(format!("{expected}: unknown parameter {key:?}")),
        }
    }
    let auth = (!password.is_empty()).then(|| Auth {
        username: Some(user).filter(|u| !u.is_empty()),
        password: Secret::new(password),
    });
    Ok(RedisNode {
        address: RedisAddress::Unix(PathBuf::from(path)),
        auth,
        db,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn syntax(tls: bool, unix: bool, auth: Option<&Auth>) -> NodeSyntax<'_> {
        NodeSyntax {
            url_var: "REDIS_URL",
            socket_var: "REDIS_SOCKET_TYPE",
            tls_var: "REDIS_TLS",
            tls,
            unix,
            auth,
        }
    }

    fn tcp(host: &str, port: u16) -> RedisAddress {
        RedisAddress::Tcp {
            host: host.to_owned(),
            port,
        }
    }

    fn with(user: Option<&str>, password: &str) -> Option<Auth> {
        Some(Auth {
            username: user.map(str::to_owned),
            password: Secret::new(password),
        })
    }

    #[test]
    fn redis_auth_is_a_password_or_user_and_password() {
        assert_eq!(auth(""), None);
        assert_eq!(auth("p@ss"), with(None, "p@ss"));
        assert_eq!(auth("user:p:ss"), with(Some("user"), "p:ss"));
        assert_eq!(auth(":pass"), with(None, "pass"));
        assert_eq!(auth("user:"), None);
    }

    #[test]
    fn bare_items_take_redis_auth() {
        let a = auth("user:p@ss");
        let s = syntax(false, false, a.as_ref());
        let n = s.node("127.0.0.1:6379").unwrap();
        assert_eq!(
            (n.address, n.auth, n.db),
            (tcp("127.0.0.1", 6379), a.clone(), 0)
        );
        assert_eq!(s.node("[::1]:6380").unwrap().address, tcp("::1", 6380));
        assert_eq!(s.node("redis-0.redis:6379/2").unwrap().db, 2);
        for bad in ["nowhere", "host:port", "host:70000", ":6379", "[::1:6379"] {
            assert_eq!(
                s.node(bad).unwrap_err().to_string(),
                format!("REDIS_URL={bad}: expected host:port")
            );
        }
        // Under the unix socket type, a path.
        let s = syntax(false, true, a.as_ref());
        let n = s.node("/run/redis.sock").unwrap();
        assert_eq!(n.address, RedisAddress::Unix("/run/redis.sock".into()));
        assert_eq!(n.auth, a);
    }

    #[test]
    fn urls_carry_their_own_credentials_and_database() {
        // REDIS_AUTH does not apply to a URL, as when URLs were passed on as given.
        let a = auth("ignored");
        let s = syntax(false, false, a.as_ref());
        let n = s.node("redis://127.0.0.1").unwrap();
        assert_eq!((n.address, n.auth, n.db), (tcp("127.0.0.1", 6379), None, 0));
        let n = s.node("redis://us%3Ar:p%40ss%2F@[::1]:6380/3").unwrap();
        assert_eq!(
            (n.address, n.auth, n.db),
            (tcp("::1", 6380), with(Some("us:r"), "p@ss/"), 3)
        );
        assert_eq!(s.node("redis://:pw@h:1").unwrap().auth, with(None, "pw"));
        assert_eq!(s.node("redis://user@h:1").unwrap().auth, None);
        let n = s
            .node("redis+unix:///run/my%20redis.sock?user=u&pass=p%26q&db=1")
            .unwrap();
        assert_eq!(
            (n.address, n.auth, n.db),
            (
                RedisAddress::Unix("/run/my redis.sock".into()),
                with(Some("u"), "p&q"),
                1
            )
        );
        let n = s.node("unix://localhost/run/redis.sock").unwrap();
        assert_eq!(n.address, RedisAddress::Unix("/run/redis.sock".into()));
        // rediss:// with REDIS_TLS.
        let s = syntax(true, false, None);
        assert_eq!(s.node("rediss://h:6380").unwrap().address, tcp("h", 6380));
    }

    #[test]
    fn bad_urls_are_refused_naming_the_variable_and_why() {
        let s = syntax(false, false, None);
        let err = |item: &str| s.node(item).unwrap_err().to_string();
        let prefix = "expected redis://[user:password@]host[:port][/database]";
        assert_eq!(
            err("redis://:p%zz@h:1"),
            format!(
                "REDIS_URL=redis://:p%zz@h:1: {prefix}: the credentials are not valid \
                 percent-encoded UTF-8 (a % takes two hex digits)"
            )
        );
        assert!(err("redis://").ends_with(": no host"));
        assert!(err("redis://h:x").contains("the port \"x\" is not a number"));
        assert!(err("redis://h:1/db0").contains("\"db0\" is not a database number"));
        assert!(err("redis://h:1/?protocol=resp3").contains("query (?...) or fragment"));
        assert!(err("rediss://h:1#insecure").contains("needs REDIS_TLS=true"));
        assert!(err("redis://0.0.0.0:6379").contains("wildcard address"));
        assert!(err("redis+unix://run/redis.sock").contains("the path must be absolute"));
        assert!(err("unix:///s?password=x").contains("unknown parameter \"password\""));
        let s = syntax(true, false, None);
        assert!(
            s.node("rediss://h:1#insecure")
                .unwrap_err()
                .to_string()
                .contains("fragment")
        );
        assert_eq!(
            s.node("unix:///run/redis.sock").unwrap_err().to_string(),
            "REDIS_URL=unix:///run/redis.sock: REDIS_TLS=true needs a TCP address \
             (REDIS_SOCKET_TYPE=tcp): Redis serves TLS on TCP only"
        );
    }

    #[test]
    fn credentials_never_show_in_debug_output() {
        let s = syntax(false, false, None);
        let n = s.node("redis://admin:hunter2@h:1").unwrap();
        assert!(!format!("{n:?}").contains("hunter2"), "{n:?}");
    }
}
