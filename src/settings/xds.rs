//! envoyproxy/ratelimit's config-source settings (CONFIG_TYPE, CONFIG_GRPC_XDS_*,
//! XDS_CLIENT_*) into [`XdsConfig`]: files (the default) or an xDS server.

use std::path::PathBuf;
use std::time::Duration;

use clap::ArgAction;

use super::parse::{Named, in_range, non_empty, pairs, parse_go_bool, positive_go_duration};
use super::tls::{key_pair, tls_name};
use super::{SettingsError, invalid};
use crate::tls::XdsTlsFiles;
use crate::xds::{XdsBackoff, XdsConfig};

/// envoyproxy/ratelimit's config-source settings: files (the default) or an xDS server.
#[derive(Clone, Debug, clap::Args)]
pub struct XdsArgs {
    /// `FILE` (the YAML files; the default) or `GRPC_XDS_SOTW` (RateLimitConfig resources
    /// streamed by an xDS server, as Envoy Gateway does).
    #[arg(
        long,
        env = "CONFIG_TYPE",
        default_value = "FILE",
        help_heading = "xDS config"
    )]
    pub config_type: String,
    /// The node id sent to the xDS server, which picks the snapshot by it.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_NODE_ID",
        default_value = "default",
        help_heading = "xDS config"
    )]
    pub config_grpc_xds_node_id: String,
    /// Node metadata sent to the xDS server: comma-separated `key=value` pairs.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_NODE_METADATA",
        default_value = "",
        help_heading = "xDS config"
    )]
    pub config_grpc_xds_node_metadata: String,
    /// The xDS server, `host:port`.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_SERVER_URL",
        default_value = "localhost:18000",
        help_heading = "xDS config"
    )]
    pub config_grpc_xds_server_url: String,
    /// After an established stream ends, wait about this long (Go duration) before reconnecting.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        default_value = "3s",
        help_heading = "xDS config"
    )]
    pub config_grpc_xds_server_connect_retry_interval: String,
    /// gRPC metadata added to the xDS stream: comma-separated `key:value` (envconfig's map
    /// format, as in the Go service) or `key=value` pairs.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        default_value = "",
        hide_env_values = true,
        help_heading = "xDS config"
    )]
    pub config_grpc_xds_client_additional_headers: String,
    /// TLS to the xDS server (an `https://` CONFIG_GRPC_XDS_SERVER_URL implies it).
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_SERVER_USE_TLS",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "xDS config"
    )]
    pub config_grpc_xds_server_use_tls: bool,
    /// PEM certificate Sluice presents to the xDS server (with CONFIG_GRPC_XDS_CLIENT_TLS_KEY).
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        help_heading = "xDS config"
    )]
    pub config_grpc_xds_client_tls_cert: Option<String>,
    /// PEM private key of CONFIG_GRPC_XDS_CLIENT_TLS_CERT.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
        help_heading = "xDS config"
    )]
    pub config_grpc_xds_client_tls_key: Option<String>,
    /// PEM CA certificate(s) the xDS server's certificate must chain to; unset, the system's
    /// trust store.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
        help_heading = "xDS config"
    )]
    pub config_grpc_xds_server_tls_cacert: Option<String>,
    /// Name (DNS or IP) to verify the xDS server's certificate against; unset, the URL's host.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
        help_heading = "xDS config"
    )]
    pub config_grpc_xds_server_tls_san: Option<String>,
    /// First delay (Go duration) after a failed connection attempt; doubles per failure.
    #[arg(
        long,
        env = "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
        default_value = "10s",
        help_heading = "xDS config"
    )]
    pub xds_client_backoff_initial_interval: String,
    /// Longest delay (Go duration) between connection attempts.
    #[arg(
        long,
        env = "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
        default_value = "60s",
        help_heading = "xDS config"
    )]
    pub xds_client_backoff_max_interval: String,
    /// With XDS_CLIENT_BACKOFF_JITTER, each delay is randomised within ±this fraction; in [0, 1].
    #[arg(
        long,
        env = "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
        default_value_t = 0.5,
        help_heading = "xDS config"
    )]
    pub xds_client_backoff_random_factor: f64,
    /// Randomise reconnection delays, so replicas do not reconnect in lockstep.
    #[arg(
        long,
        env = "XDS_CLIENT_BACKOFF_JITTER",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "true",
        value_parser = parse_go_bool,
        help_heading = "xDS config"
    )]
    pub xds_client_backoff_jitter: bool,
    /// Largest xDS response accepted, in bytes; 0 or unset keeps gRPC's 4 MiB.
    #[arg(
        long,
        env = "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
        help_heading = "xDS config"
    )]
    pub xds_client_max_msg_size_in_bytes: Option<usize>,
}

impl XdsArgs {
    /// `None` for CONFIG_TYPE=FILE. The xDS variables are only checked for GRPC_XDS_SOTW, so
    /// leftovers in a file-based deployment cannot stop it.
    pub(super) fn validate(self) -> Result<Option<XdsConfig>, SettingsError> {
        match self.config_type.to_ascii_uppercase().as_str() {
            "FILE" => return Ok(None),
            "GRPC_XDS_SOTW" => {}
            _ => {
                return Err(invalid(
                    "CONFIG_TYPE",
                    &self.config_type,
                    "expected FILE or GRPC_XDS_SOTW",
                ));
            }
        }
        if self.config_grpc_xds_node_id.is_empty() {
            return Err(invalid("CONFIG_GRPC_XDS_NODE_ID", "", "must not be empty"));
        }
        let node_metadata = pairs(&self.config_grpc_xds_node_metadata, &['='])
            .map_err(|e| invalid("CONFIG_GRPC_XDS_NODE_METADATA", e, "expected key=value"))?;
        let additional_headers = self.additional_headers()?;
        let XdsServer {
            uri: server_uri,
            tls,
        } = self.server()?;
        let connect_retry_interval = positive_duration(
            "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
            &self.config_grpc_xds_server_connect_retry_interval,
        )?;
        let backoff = self.backoff()?;
        Ok(Some(XdsConfig {
            node_id: self.config_grpc_xds_node_id,
            node_metadata,
            server_uri,
            connect_retry_interval,
            additional_headers,
            backoff,
            max_msg_size: self.xds_client_max_msg_size_in_bytes.filter(|&n| n > 0),
            tls,
        }))
    }

    /// CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS, as gRPC metadata.
    fn additional_headers(&self) -> Result<Vec<(String, String)>, SettingsError> {
        pairs(&self.config_grpc_xds_client_additional_headers, &[':', '='])
            .map_err(|e| {
                invalid(
                    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                    e,
                    "expected key:value or key=value",
                )
            })?
            .into_iter()
            .map(|(k, v)| grpc_metadata(k, v))
            .collect()
    }

    /// The server's URI for the gRPC client, and its TLS files (with
    /// CONFIG_GRPC_XDS_SERVER_USE_TLS or an `https://` URL).
    fn server(&self) -> Result<XdsServer, SettingsError> {
        let ServerTarget { target, https } = xds_server_target(&self.config_grpc_xds_server_url)?;
        let tls = if self.config_grpc_xds_server_use_tls || https {
            Some(xds_tls(
                self.config_grpc_xds_client_tls_cert.as_deref(),
                self.config_grpc_xds_client_tls_key.as_deref(),
                self.config_grpc_xds_server_tls_cacert.as_deref(),
                self.config_grpc_xds_server_tls_san.as_deref(),
            )?)
        } else {
            None
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        Ok(XdsServer {
            uri: format!("{scheme}://{target}"),
            tls,
        })
    }

    /// XDS_CLIENT_BACKOFF_*.
    fn backoff(&self) -> Result<XdsBackoff, SettingsError> {
        let initial = positive_duration(
            "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
            &self.xds_client_backoff_initial_interval,
        )?;
        let max = positive_duration(
            "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
            &self.xds_client_backoff_max_interval,
        )?;
        if max < initial {
            return Err(invalid(
                "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
                &self.xds_client_backoff_max_interval,
                "must not be shorter than XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
            ));
        }
        let random_factor = in_range(
            "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
            self.xds_client_backoff_random_factor,
            0.0..=1.0,
        )?;
        Ok(XdsBackoff {
            initial,
            max,
            random_factor,
            jitter: self.xds_client_backoff_jitter,
        })
    }
}

fn positive_duration(var: &'static str, value: &str) -> Result<Duration, SettingsError> {
    positive_go_duration(var, value, "500ms or 3s")
}

/// gRPC metadata keys are lower case (Go's `metadata.New` lower-cases them too); binary
/// (`-bin`) keys and non-ASCII values cannot come from an environment variable sensibly.
pub(super) fn grpc_metadata(key: String, value: String) -> Result<(String, String), SettingsError> {
    let var = "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS";
    let key = key.to_ascii_lowercase();
    let key_ok = key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if !key_ok || key.ends_with("-bin") || key.starts_with("grpc-") {
        return Err(invalid(var, key, "not a valid ASCII gRPC metadata key"));
    }
    if !value.bytes().all(|b| b == b' ' || b.is_ascii_graphic()) {
        return Err(invalid(var, key, "the value must be printable ASCII"));
    }
    Ok((key, value))
}

pub(super) fn xds_tls(
    cert: Option<&str>,
    key: Option<&str>,
    ca: Option<&str>,
    san: Option<&str>,
) -> Result<XdsTlsFiles, SettingsError> {
    let client_identity = key_pair(
        Named::new("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert.unwrap_or("")),
        Named::new("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", key.unwrap_or("")),
    )?;
    Ok(XdsTlsFiles {
        client_identity,
        server_ca: non_empty(ca).map(PathBuf::from),
        server_name: non_empty(san)
            .map(|s| tls_name("CONFIG_GRPC_XDS_SERVER_TLS_SAN", s))
            .transpose()?,
    })
}

/// The xDS server's URI for the gRPC client, and its TLS files.
struct XdsServer {
    uri: String,
    tls: Option<XdsTlsFiles>,
}

/// CONFIG_GRPC_XDS_SERVER_URL as a gRPC target.
struct ServerTarget {
    /// `host:port`.
    target: String,
    /// Whether the URL asked for TLS (`https://`).
    https: bool,
}

/// The Go service dials a gRPC target, `host:port`; `http://host:port`, `https://host:port`
/// and `dns:///host:port` are accepted too.
fn xds_server_target(url: &str) -> Result<ServerTarget, SettingsError> {
    let var = "CONFIG_GRPC_XDS_SERVER_URL";
    let (rest, https) = match url.strip_prefix("https://") {
        Some(rest) => (rest, true),
        None => (url, false),
    };
    let target = rest
        .strip_prefix("http://")
        .or_else(|| rest.strip_prefix("dns:///"))
        .unwrap_or(rest)
        .trim_end_matches('/');
    let valid = target.rsplit_once(':').is_some_and(|(host, port)| {
        let host_ok = !host.is_empty()
            && !host.contains(['/', '@', '?', '#', ' '])
            && (host.starts_with('[') == host.ends_with(']'));
        host_ok && port.parse::<u16>().is_ok_and(|p| p > 0)
    });
    if !valid {
        return Err(invalid(var, url, "expected host:port"));
    }
    Ok(ServerTarget {
        target: target.to_owned(),
        https,
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{error, settings};
    use super::super::*;
    use super::*;

    #[test]
    #[expect(
        clippy::too_many_lines,
        reason = "one end-to-end scenario, step by step; to split next"
    )]
    fn config_type_selects_xds_with_go_defaults() {
        assert_eq!(settings(&[]).unwrap().config.xds, None);
        assert_eq!(
            settings(&["--config-type", "file"]).unwrap().config.xds,
            None
        );
        // xDS variables are ignored (not even checked) for files.
        assert_eq!(
            settings(&["--config-grpc-xds-server-use-tls=true"])
                .unwrap()
                .config
                .xds,
            None
        );
        let x = settings(&["--config-type", "GRPC_XDS_SOTW"])
            .unwrap()
            .config
            .xds
            .expect("xds");
        assert_eq!(
            x,
            XdsConfig {
                node_id: "default".into(),
                node_metadata: vec![],
                server_uri: "http://localhost:18000".into(),
                connect_retry_interval: Duration::from_secs(3),
                additional_headers: vec![],
                backoff: XdsBackoff {
                    initial: Duration::from_secs(10),
                    max: Duration::from_secs(60),
                    random_factor: 0.5,
                    jitter: true,
                },
                max_msg_size: None,
                tls: None,
            }
        );
        let xds = |extra: &[&str]| {
            let mut args = vec!["--config-type", "GRPC_XDS_SOTW"];
            args.extend_from_slice(extra);
            settings(&args).map(|s| s.config.xds.expect("xds"))
        };
        let x = xds(&[
            "--config-grpc-xds-node-id",
            "envoy-ratelimit",
            "--config-grpc-xds-node-metadata",
            "zone=a, team=x=y,",
            "--config-grpc-xds-server-url",
            "envoy-gateway:18001",
            "--config-grpc-xds-client-additional-headers",
            "X-Token:abc,tenant=t1",
            "--xds-client-backoff-jitter=false",
            "--xds-client-max-msg-size-in-bytes",
            "8388608",
        ])
        .unwrap();
        assert_eq!(x.node_id, "envoy-ratelimit");
        assert_eq!(
            x.node_metadata,
            vec![("zone".into(), "a".into()), ("team".into(), "x=y".into())]
        );
        assert_eq!(x.server_uri, "http://envoy-gateway:18001");
        assert_eq!(
            x.additional_headers,
            vec![
                ("x-token".into(), "abc".into()),
                ("tenant".into(), "t1".into())
            ]
        );
        assert!(!x.backoff.jitter);
        assert_eq!(x.max_msg_size, Some(8 << 20));

        let err = |extra: &[&str]| xds(extra).unwrap_err().to_string();
        assert_eq!(
            error(&["--config-type", "rest"]),
            "CONFIG_TYPE=rest: expected FILE or GRPC_XDS_SOTW"
        );
        // TLS: the flag or an https:// URL; the files are named here and read at start-up.
        let x = xds(&[
            "--config-grpc-xds-server-use-tls=true",
            "--config-grpc-xds-server-url",
            "envoy-gateway:18001",
            "--config-grpc-xds-client-tls-cert",
            "/certs/tls.crt",
            "--config-grpc-xds-client-tls-key",
            "/certs/tls.key",
            "--config-grpc-xds-server-tls-cacert",
            "/certs/ca.crt",
        ])
        .unwrap();
        assert_eq!(x.server_uri, "https://envoy-gateway:18001");
        assert_eq!(
            x.tls,
            Some(XdsTlsFiles {
                client_identity: Some(("/certs/tls.crt".into(), "/certs/tls.key".into())),
                server_ca: Some("/certs/ca.crt".into()),
                server_name: None,
            })
        );
        let x = xds(&[
            "--config-grpc-xds-server-url",
            "https://cp:18000",
            "--config-grpc-xds-server-tls-san",
            "cp.example",
            "--config-grpc-xds-server-tls-cacert",
            "",
        ])
        .unwrap();
        assert_eq!(x.server_uri, "https://cp:18000");
        assert_eq!(
            x.tls,
            Some(XdsTlsFiles {
                client_identity: None,
                server_ca: None,
                server_name: Some("cp.example".into()),
            })
        );
        // Files named without TLS are ignored, as in the Go service.
        let x = xds(&["--config-grpc-xds-server-tls-cacert", "/certs/ca.crt"]).unwrap();
        assert_eq!(
            (x.server_uri.as_str(), x.tls),
            ("http://localhost:18000", None)
        );
        assert_eq!(
            err(&[
                "--config-grpc-xds-server-use-tls=true",
                "--config-grpc-xds-client-tls-cert",
                "/certs/tls.crt",
            ]),
            "CONFIG_GRPC_XDS_CLIENT_TLS_CERT=/certs/tls.crt: needs \
             CONFIG_GRPC_XDS_CLIENT_TLS_KEY, the certificate's private key"
        );
        assert_eq!(
            err(&[
                "--config-grpc-xds-server-use-tls=true",
                "--config-grpc-xds-server-tls-san",
                "not a name",
            ]),
            "CONFIG_GRPC_XDS_SERVER_TLS_SAN=not a name: expected a DNS name or an IP address"
        );
        assert_eq!(
            err(&["--config-grpc-xds-server-url", "cp"]),
            "CONFIG_GRPC_XDS_SERVER_URL=cp: expected host:port"
        );
        assert_eq!(
            err(&["--config-grpc-xds-node-metadata", "zone"]),
            "CONFIG_GRPC_XDS_NODE_METADATA=zone: expected key=value"
        );
        assert!(
            err(&["--config-grpc-xds-client-additional-headers", "k-bin:x"])
                .starts_with("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS=k-bin:")
        );
        assert!(
            err(&["--config-grpc-xds-server-connect-retry-interval", "3"])
                .starts_with("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL=3:")
        );
        assert!(
            err(&["--xds-client-backoff-max-interval", "1s"])
                .starts_with("XDS_CLIENT_BACKOFF_MAX_INTERVAL=1s: must not be shorter")
        );
        assert!(
            err(&["--xds-client-backoff-random-factor", "1.5"])
                .starts_with("XDS_CLIENT_BACKOFF_RANDOM_FACTOR=1.5:")
        );
    }
}
