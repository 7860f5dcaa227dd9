//! Listener addresses: a host resolved once, at start-up, and no two listeners on one address.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

use super::parse::Named;
use super::{SettingsError, invalid};

/// `host` is an IP literal (IPv6 with or without brackets) or a name resolved now. A name with
/// several addresses binds the first IPv4 one, as Go's `net.Listen("tcp", ...)` does.
pub(super) fn resolve_listener(
    var: &'static str,
    host: &str,
    port: u16,
) -> Result<SocketAddr, SettingsError> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let addrs: Vec<SocketAddr> = (bare, port)
        .to_socket_addrs()
        .map_err(|source| SettingsError::Resolve {
            var,
            host: host.to_owned(),
            source,
        })?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| invalid(var, host, "resolves to no addresses"))
}

/// Two listeners on one address would fail at bind time with a less helpful message. Port 0
/// is exempt: each bind picks its own port.
pub(super) fn check_distinct(listeners: &[Named<SocketAddr>]) -> Result<(), SettingsError> {
    for (i, listener) in listeners.iter().enumerate() {
        let addr = listener.value;
        if addr.port() == 0 {
            continue;
        }
        if let Some(other) = listeners[..i].iter().find(|l| l.value == addr) {
            return Err(invalid(
                listener.var,
                addr.port(),
                format!("{addr} is already used by the {} listener", other.var),
            ));
        }
    }
    Ok(())
}
